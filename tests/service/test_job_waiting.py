"""Waiting for a job without hammering the gateway: GET /jobs/{id} with its ETag and 304,
the long-poll (?wait=S with If-None-Match), server-sent events, and the SDK's wait() on them.

Against real gateways: `serve` on the embedded SQLite job table, and in Redis mode two gateway
processes on one port (STITCHSIM_GATEWAY_WORKERS=2) on PostgreSQL where it answers. Most run the
gateway alone with submission checks off (jobs stay queued) and change a job's row straight in
the job table, as a worker does; the events and the SDK run a real job on real workers.
"""

from __future__ import annotations

import random
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text
from stitchsim import Client
from stitchsim.models import JobStatus

from tests.fixtures_service import ServiceFactory, ServiceHandle, cli_command
from tests.service.conftest import tiny_spec, upload
from tests.service.helpers import TINY_SPEC, assert_error_body

ENV = {"STITCHSIM_CHECK_TIMEOUT_S": "0", "STITCHSIM_REQUIRE_API_KEY": "true"}
WATCH_S = 0.5  # STITCHSIM_JOB_WATCH_INTERVAL_S's default


def _job(svc: ServiceHandle, key: str, ckpts: Any) -> str:
    with svc.client(key) as c:
        ids = [upload(c, p) for p in (ckpts.digits_resnet, ckpts.digits_resnet_b)]
        r = c.post("/similarity", json=tiny_spec({"checkpoint": ids[0]},
                                                 {"checkpoint": ids[1]}))
        assert r.status_code == 202, r.text
        return str(r.json()["job_id"])


def _set_progress(svc: ServiceHandle, job_id: str, done: int) -> None:
    """What a worker's heartbeat writes, written by the test straight into the job table."""
    engine = create_engine(svc._sqlalchemy_url())
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE jobs SET state = 'running', stage = 'training', "
                              "done = :done, total = 100 WHERE id = :id"),
                         {"done": done, "id": job_id})
    finally:
        engine.dispose()


def _metric(svc: ServiceHandle, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include these."""
    total = 0.0
    for line in httpx.get(svc.url + "/metrics", timeout=10).text.splitlines():
        m = re.match(rf"{name}(?:\{{(.*)\}})? ([0-9.e+-]+)$", line)
        if m is None:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[Callable[[str], ServiceHandle]]:
    """One gateway of each mode for the whole module, started when first asked for: the tests
    here each make their own keys and jobs, and count metrics as differences, so they need no
    service of their own (a start costs seconds of CPU each)."""
    factory = ServiceFactory(tmp_path_factory)
    started: dict[str, ServiceHandle] = {}

    def get(mode: str) -> ServiceHandle:
        if mode not in started:
            if mode == "embedded":
                started[mode] = factory.embedded(extra_env=ENV, workers=False)
            else:
                started[mode] = factory.redis(
                    keys=False, workers=False,
                    extra_env={**ENV, "STITCHSIM_GATEWAY_WORKERS": "2"})
        return started[mode]

    yield get
    factory.close()


@pytest.mark.parametrize("mode", ["embedded", "redis"])
def test_etag_and_if_none_match(mode: str, gateways: Callable[[str], ServiceHandle],
                                ckpts: Any) -> None:
    svc = gateways(mode)
    alice, bob = svc.create_key("alice"), svc.create_key("bob")
    job = _job(svc, alice, ckpts)
    # Fresh connections: in Redis mode they land on either gateway process, and each gives
    # the same strong ETag for the same status (it is the body's digest, nothing kept).
    answers = [httpx.get(f"{svc.url}/jobs/{job}", headers={"Authorization": f"Bearer {alice}"},
                         timeout=30) for _ in range(10)]
    assert {r.status_code for r in answers} == {200}
    etag = answers[0].headers["ETag"]
    assert re.fullmatch(r'"[0-9a-f]{32}"', etag), etag
    assert {r.headers["ETag"] for r in answers} == {etag}
    assert len({r.content for r in answers}) == 1
    assert answers[0].headers["Cache-Control"] == "private, no-cache"
    status = JobStatus.model_validate_json(answers[0].content)
    assert status.state == "queued" and status.spec is not None
    with svc.client(alice) as c:
        for sent in (etag, f"W/{etag}", f'"0000", {etag}', "*"):
            r = c.get(f"/jobs/{job}", headers={"If-None-Match": sent})
            assert r.status_code == 304 and r.content == b"", (sent, r.status_code)
            assert r.headers["ETag"] == etag
        assert c.get(f"/jobs/{job}", headers={"If-None-Match": '"0000"'}).content == \
            answers[0].content
        # X-API-Key is read as the route reads it.
        r = c.get(f"/jobs/{job}", headers={"Authorization": "", "X-API-Key": alice,
                                           "If-None-Match": etag})
        assert r.status_code == 304
        # Refusals come first: another key's job, no key, a wrong key before the right one,
        # a malformed id; If-None-Match changes none of them.
        with svc.client(bob) as b:
            r = b.get(f"/jobs/{job}", headers={"If-None-Match": etag})
            assert r.status_code == 404 and assert_error_body(r)["code"] == "not_found"
        r = httpx.get(f"{svc.url}/jobs/{job}", headers={"If-None-Match": etag}, timeout=10)
        assert r.status_code == 401 and assert_error_body(r)["code"] == "unauthorized"
        r = httpx.get(f"{svc.url}/jobs/{job}", timeout=10, headers=[
            ("Authorization", "Bearer wrong"), ("Authorization", f"Bearer {alice}")])
        assert r.status_code == 401
        assert c.get("/jobs/" + "g" * 32).status_code == 404
        for bad in ("-1", "soon", "nan", "inf"):
            r = c.get(f"/jobs/{job}", params={"wait": bad})
            assert r.status_code == 422, (bad, r.text)
            assert "wait" in str(assert_error_body(r)["details"])
        # A change made elsewhere (a worker's progress, a cancel) gives a new ETag at once.
        _set_progress(svc, job, 3)
        r = c.get(f"/jobs/{job}", headers={"If-None-Match": etag})
        assert r.status_code == 200 and r.headers["ETag"] != etag
        assert JobStatus.model_validate_json(r.content).progress.done == 3
        assert c.delete(f"/jobs/{job}").status_code in (200, 202)
    if mode == "embedded":
        # Answered polls (200 and 304) write no access line unless STITCHSIM_ACCESS_LOG_POLLS;
        # other requests keep theirs.
        log = (svc.data_dir / "logs" / "serve.log").read_text()
        assert f'"DELETE /jobs/{job} HTTP/1.1"' in log
        assert f'"GET /jobs/{"g" * 32} HTTP/1.1" 404' in log
        assert f'"GET /jobs/{job} HTTP/1.1" 200' not in log
        assert f'"GET /jobs/{job} HTTP/1.1" 304' not in log


def _long_poll(svc: ServiceHandle, key: str, job: str, etag: str,
               wait: float) -> tuple[httpx.Response, float]:
    t0 = time.monotonic()
    with svc.client(key) as c:
        r = c.get(f"/jobs/{job}", params={"wait": wait}, headers={"If-None-Match": etag})
    return r, time.monotonic() - t0


@pytest.mark.parametrize("mode", ["embedded", "redis"])
def test_long_poll_returns_at_a_change_or_after_the_wait(
        mode: str, gateways: Callable[[str], ServiceHandle], ckpts: Any) -> None:
    svc = gateways(mode)
    waits_before = _metric(svc, "stitchsim_http_requests_total", route="/jobs/{job_id}?wait")
    key = svc.create_key("carol")
    job = _job(svc, key, ckpts)
    with svc.client(key) as c:
        etag = c.get(f"/jobs/{job}").headers["ETag"]
    # No change: 304 once the wait is over, not sooner.
    r, took = _long_poll(svc, key, job, etag, 2)
    assert r.status_code == 304 and r.headers["ETag"] == etag
    assert 2.0 <= took < 2.0 + WATCH_S + 1.5, took
    # A stale ETag, or none: the status at once, whatever the wait.
    r, took = _long_poll(svc, key, job, '"stale"', 30)
    assert r.status_code == 200 and took < 1.5, took
    with svc.client(key) as c:
        t0 = time.monotonic()
        assert c.get(f"/jobs/{job}", params={"wait": 30}).status_code == 200
        assert time.monotonic() - t0 < 1.5
    # A change 1 s into a 30 s wait: the new status within the watcher's interval.
    timer = threading.Timer(1.0, _set_progress, (svc, job, 5))
    timer.start()
    r, took = _long_poll(svc, key, job, etag, 30)
    timer.join()
    assert r.status_code == 200, r.text
    assert JobStatus.model_validate_json(r.content).progress.done == 5
    assert 1.0 <= took < 1.0 + WATCH_S + 1.5, took
    # Cancelling a queued job through another connection (in Redis mode, maybe another
    # gateway process) ends the wait of every waiter, with the same new status; a wait longer
    # than 60 s is cut, not refused.
    job = _job(svc, key, ckpts)
    with svc.client(key) as c:
        etag = c.get(f"/jobs/{job}").headers["ETag"]
    results: list[tuple[httpx.Response, float]] = []
    waiters = [threading.Thread(target=lambda: results.append(
        _long_poll(svc, key, job, etag, 100_000))) for _ in range(6)]
    for t in waiters:
        t.start()
    time.sleep(1.0)
    with svc.client(key) as c:
        assert c.delete(f"/jobs/{job}").status_code == 200
    for t in waiters:
        t.join(30)
    assert len(results) == 6
    assert {r.status_code for r, _ in results} == {200}
    assert {JobStatus.model_validate_json(r.content).state for r, _ in results} == {"cancelled"}
    assert len({r.headers["ETag"] for r, _ in results}) == 1
    assert max(took for _, took in results) < 1.0 + WATCH_S + 2.0
    # A finished job never changes: a long-poll on it answers at once.
    r, took = _long_poll(svc, key, job, results[0][0].headers["ETag"], 30)
    assert r.status_code == 304 and took < 1.5, took
    if mode == "embedded":
        # Counted in /metrics apart from plain polls (their time is mostly waiting).
        # The waits above that waited: one 304, one change, six cancels.
        assert _metric(svc, "stitchsim_http_requests_total",
                       route="/jobs/{job_id}?wait") - waits_before == 8


def test_waiting_clients_cost_one_table_read_per_interval(
        gateways: Callable[[str], ServiceHandle], ckpts: Any) -> None:
    """30 clients waiting 6 s on 3 jobs: the gateway reads the job table about once per
    watcher interval for all of them together, not once per client; and not at all once
    they are gone."""
    svc = gateways("embedded")
    key = svc.create_key("dora")
    jobs = [_job(svc, key, ckpts) for _ in range(3)]
    with svc.client(key) as c:
        etags = [c.get(f"/jobs/{j}").headers["ETag"] for j in jobs]
    before = _metric(svc, "stitchsim_job_watch_reads_total")
    results: list[tuple[httpx.Response, float]] = []
    threads = [threading.Thread(target=lambda i=i: results.append(
        _long_poll(svc, key, jobs[i % 3], etags[i % 3], 6))) for i in range(30)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    # All 30 are waiting at once (on a loaded machine the threads take a while to connect).
    deadline = time.monotonic() + 4.0
    while _metric(svc, "stitchsim_job_waiters") < 30 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _metric(svc, "stitchsim_job_waiters") == 30
    for t in threads:
        t.join(30)
    span = time.monotonic() - t0
    reads = _metric(svc, "stitchsim_job_watch_reads_total") - before
    print(f"30 waiting clients for {span:.1f} s: {reads:.0f} reads of the job table")
    assert [r.status_code for r, _ in results] == [304] * 30
    assert 1 <= reads <= span / WATCH_S + 2, reads
    assert _metric(svc, "stitchsim_job_waiters") == 0
    time.sleep(3 * WATCH_S)
    assert _metric(svc, "stitchsim_job_watch_reads_total") - before == reads


def test_revoked_key_stops_within_the_cache_ttl(gateways: Callable[[str], ServiceHandle],
                                                ckpts: Any) -> None:
    from stitchsim_service.gateway.deps import _KeyCache

    svc = gateways("embedded")
    key = svc.create_key("erin")
    job = _job(svc, key, ckpts)
    with svc.client(key) as c:
        assert c.get(f"/jobs/{job}").status_code == 200
        key_id = next(line.split("\t")[0] for line in subprocess.run(
            cli_command("keys", "list"), env=svc.env, capture_output=True, text=True,
            check=True, timeout=60).stdout.splitlines() if "\terin\t" in line)
        subprocess.run(cli_command("keys", "revoke", key_id), env=svc.env, check=True,
                       capture_output=True, timeout=60)
        revoked = time.monotonic()
        while c.get(f"/jobs/{job}").status_code == 200:
            assert time.monotonic() - revoked < _KeyCache.TTL_S + 2, "revoked key still works"
            time.sleep(0.2)
        assert c.get(f"/jobs/{job}").status_code == 401


# ---------------------------------------------------------------- real jobs


def _uncached_spec(epochs: int = 1) -> dict[str, Any]:
    """A small spec no other test ran (its own seed), so the job computes rather than finding
    its stitches in the workers' cache, and shows progress for a few seconds."""
    return {**TINY_SPEC, "train": {**TINY_SPEC["train"], "epochs": epochs,
                                   "max_train_samples": 1000,
                                   "seed": random.randrange(1000, 10**6)}}


def _events(response: httpx.Response) -> list[tuple[str, JobStatus]]:
    """(id, status) of each event of a finished stream."""
    out: list[tuple[str, JobStatus]] = []
    event_id = ""
    for line in response.iter_lines():
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            out.append((event_id, JobStatus.model_validate_json(line[6:])))
    return out


def test_events_follow_a_real_job_to_succeeded(live_service: ServiceHandle, ckpts: Any) -> None:
    with live_service.client() as c:
        ids = [upload(c, p) for p in (ckpts.digits_resnet, ckpts.digits_resnet_b)]
        r = c.post("/similarity", json={**_uncached_spec(), "front": {"checkpoint": ids[0]},
                                        "back": {"checkpoint": ids[1]}})
        assert r.status_code == 202, r.text
        job = r.json()["job_id"]
        t0 = time.monotonic()
        with c.stream("GET", f"/jobs/{job}/events") as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            assert stream.headers["cache-control"] == "no-cache"
            events = _events(stream)  # returns when the server ends the stream
        took = time.monotonic() - t0
        states = [s.state for _, s in events]
        print(f"{len(events)} events in {took:.1f} s: {states}")
        assert states[-1] == "succeeded" and "running" in states
        assert "succeeded" not in states[:-1]
        order = {"queued": 0, "running": 1, "succeeded": 2}
        assert [order[s] for s in states] == sorted(order[s] for s in states)
        running = [s.progress.done for _, s in events if s.state == "running"]
        assert running == sorted(running)
        # Every event is a change: its id is the status's ETag, as GET /jobs/{id} gives it.
        assert len({i for i, _ in events}) == len(events)
        last = c.get(f"/jobs/{job}")
        assert events[-1][0] == last.headers["ETag"]
        assert JobStatus.model_validate_json(last.content) == events[-1][1]
        # Resuming after the last event of a finished job: nothing more, the stream ends.
        with c.stream("GET", f"/jobs/{job}/events",
                      headers={"Last-Event-ID": events[-1][0]}) as stream:
            assert _events(stream) == []
        with c.stream("GET", f"/jobs/{job}/events",
                      headers={"Last-Event-ID": events[0][0]}) as stream:
            assert [s.state for _, s in _events(stream)] == ["succeeded"]


def test_sdk_wait_costs_one_request_per_change(live_service: ServiceHandle,
                                               ckpts: Any) -> None:
    """Job.wait() on a real job: every answer the gateway gives is a new status (one request
    per change of state or progress), except a 304 per 30 s without one; the progress
    callback sees each change."""
    routes = ("/jobs/{job_id}", "/jobs/{job_id}?wait")

    def count(status: str) -> float:
        return sum(_metric(live_service, "stitchsim_http_requests_total", method="GET",
                           route=r, status=status) for r in routes)

    seen: list[JobStatus] = []
    with Client(live_service.url) as client:
        job = client.compare(ckpts.digits_resnet, ckpts.digits_resnet_b,
                             spec=_uncached_spec(epochs=3))
        before = {s: count(s) for s in ("200", "304")}
        t0 = time.monotonic()
        report = job.wait(timeout=300, progress=seen.append)
        took = time.monotonic() - t0
    answered = {s: count(s) - before[s] for s in ("200", "304")}
    changes = sum(1 for i, s in enumerate(seen) if i == 0 or s != seen[i - 1])
    print(f"job of {took:.1f} s: {len(seen)} answers, {changes} changes, "
          f"requests {answered}")
    assert report.job_id == job.id
    assert [s.state for s in seen][-1] == "succeeded" and changes >= 3
    assert answered["200"] == changes
    assert answered["304"] <= took / 30 + 1
