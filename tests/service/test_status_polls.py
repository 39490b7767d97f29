"""Status polls (GET /jobs/{id}) on their fast path (gateway.routers.jobs.StatusPolls) answer
exactly what the route answers, refuse what it refuses, follow the job table at once, and
do so with several gateway processes on one port (STITCHSIM_GATEWAY_WORKERS).

The services run the gateway alone with submission checks off: jobs stay queued.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from typing import Any

import httpx
import pytest
from stitchsim.models import JobStatus

from tests.fixtures_service import ServiceFactory, ServiceHandle, _children, cli_command
from tests.service.conftest import tiny_spec, upload

ENV = {"STITCHSIM_CHECK_TIMEOUT_S": "0", "STITCHSIM_REQUIRE_API_KEY": "true"}


def _job(svc: ServiceHandle, key: str, ckpts: Any) -> str:
    with svc.client(key) as c:
        ids = [upload(c, p) for p in (ckpts.digits_resnet, ckpts.digits_resnet_b)]
        r = c.post("/similarity", json=tiny_spec({"checkpoint": ids[0]},
                                                 {"checkpoint": ids[1]}))
        assert r.status_code == 202, r.text
        return str(r.json()["job_id"])


def _poll_count(svc: ServiceHandle) -> float:
    text = httpx.get(svc.url + "/metrics", timeout=10).text
    m = re.search(r'stitchsim_http_requests_total\{method="GET",route="/jobs/\{job_id\}",'
                  r'status="200"\} ([0-9.e+]+)', text)
    return float(m.group(1)) if m else 0.0


@pytest.mark.parametrize("mode", ["embedded", "redis"])
def test_fast_path_answers_as_the_route(mode: str, service_factory: ServiceFactory,
                                        ckpts: Any) -> None:
    # redis: the job table in PostgreSQL where it answers, so the lookup is a pooled Core read
    # in a thread rather than SQLite's on the loop.
    svc = (service_factory.embedded(extra_env=ENV, workers=False) if mode == "embedded"
           else service_factory.redis(keys=False, extra_env=ENV, workers=False))
    alice, bob = svc.create_key("alice"), svc.create_key("bob")
    job = _job(svc, alice, ckpts)
    before = _poll_count(svc)
    with svc.client(alice) as c:
        # The first poll of a key goes through the route (key not cached yet); the rest are
        # answered by the fast path: the same bytes, a valid JobStatus with the stored spec.
        bodies = [c.get(f"/jobs/{job}") for _ in range(5)]
        assert {r.status_code for r in bodies} == {200}
        assert len({r.content for r in bodies}) == 1
        assert {r.headers["content-type"] for r in bodies} == {"application/json"}
        status = JobStatus.model_validate_json(bodies[0].content)
        assert status.id == job and status.state == "queued" and status.spec is not None
        # X-API-Key is read as the route reads it.
        assert c.get(f"/jobs/{job}", headers={"Authorization": "",
                                              "X-API-Key": alice}).content == bodies[0].content
        # Still counted by the metrics, under the route's template.
        assert _poll_count(svc) >= before + 6
        # Refusals stay the route's: another key's job, no key, a malformed id, a query.
        with svc.client(bob) as b:
            for _ in range(2):  # uncached, then cached key
                r = b.get(f"/jobs/{job}")
                assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        r = httpx.get(f"{svc.url}/jobs/{job}", timeout=10)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        assert c.get("/jobs/" + "g" * 32).status_code == 404
        # A state change shows on the very next poll: nothing is cached but keys.
        assert c.delete(f"/jobs/{job}").status_code == 200
        assert c.get(f"/jobs/{job}").json()["state"] == "cancelled"


def test_revoked_key_stops_within_the_cache_ttl(service_factory: ServiceFactory,
                                                ckpts: Any) -> None:
    from stitchsim_service.gateway.deps import _KeyCache

    svc = service_factory.embedded(extra_env=ENV, workers=False)
    key = svc.create_key("carol")
    job = _job(svc, key, ckpts)
    with svc.client(key) as c:
        assert c.get(f"/jobs/{job}").status_code == 200
        key_id = next(line.split("\t")[0] for line in subprocess.run(
            cli_command("keys", "list"), env=svc.env, capture_output=True, text=True,
            check=True, timeout=60).stdout.splitlines() if "\tcarol\t" in line)
        subprocess.run(cli_command("keys", "revoke", key_id), env=svc.env, check=True,
                       capture_output=True, timeout=60)
        revoked = time.monotonic()
        while c.get(f"/jobs/{job}").status_code == 200:
            assert time.monotonic() - revoked < _KeyCache.TTL_S + 2, "revoked key still works"
            time.sleep(0.2)
        assert c.get(f"/jobs/{job}").status_code == 401


def test_several_gateway_processes(service_factory: ServiceFactory, ckpts: Any) -> None:
    svc = service_factory.embedded(extra_env={**ENV, "STITCHSIM_GATEWAY_WORKERS": "2"},
                                   workers=False)
    # serve, and under it uvicorn's two gateway processes.
    assert len(_children(svc.procs["serve"].pid)) >= 2
    key = svc.create_key("dan")
    job = _job(svc, key, ckpts)
    headers = {"Authorization": f"Bearer {key}"}
    # Fresh connections land on either process; each answers from the one job table.
    for _ in range(20):
        r = httpx.get(f"{svc.url}/jobs/{job}", headers=headers, timeout=10)
        assert r.status_code == 200 and r.json()["state"] == "queued"
    assert httpx.delete(f"{svc.url}/jobs/{job}", headers=headers, timeout=10).status_code == 200
    for _ in range(20):
        assert httpx.get(f"{svc.url}/jobs/{job}", headers=headers,
                         timeout=10).json()["state"] == "cancelled"


def _exchange(port: int, raw: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Send raw bytes on one connection at once (pipelined) and read every response until the
    server closes it: (status, headers, body) in order."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(raw)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        n = int(headers.get("content-length", "0"))
        out.append((int(lines[0].split()[1]), headers, rest[:n]))
        data = rest[n:]
    return out


def _port(svc: ServiceHandle) -> int:
    return int(svc.url.rsplit(":", 1)[1])


def test_protocol_answers_keep_order_and_leave_other_requests_alone(
        service_factory: ServiceFactory, ckpts: Any) -> None:
    """Polls answered by the HTTP protocol (edge.GuardedProtocol) beside requests it passes
    on, pipelined on one connection: every answer in order, the same bytes as the route's,
    bodies of other requests still read; and no access line for answered polls unless
    STITCHSIM_ACCESS_LOG_POLLS (the other requests keep theirs)."""
    svc = service_factory.embedded(extra_env=ENV, workers=False)
    key = svc.create_key("erin")
    job = _job(svc, key, ckpts)
    with svc.client(key) as c:
        via_route = c.get(f"/jobs/{job}?from=route")  # a query: always the route
        assert via_route.status_code == 200
        assert c.get(f"/jobs/{job}").content == via_route.content  # the key is cached now
    auth = f"Authorization: Bearer {key}\r\n"
    poll = f"GET /jobs/{job} HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode()
    spec = b"{}"
    answers = _exchange(_port(svc), b"".join([
        poll,  # the connection's first request, answered by the protocol
        f"POST /similarity HTTP/1.1\r\nHost: x\r\n{auth}content-type: application/json\r\n"
        f"content-length: {len(spec)}\r\n\r\n".encode() + spec,  # a body after it
        poll,  # behind a request in flight: queued as uvicorn queues it
        f"GET /jobs/{job}?again=1 HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode(),
        f"GET /jobs/{'0' * 32} HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode(),  # not a job
        poll,
        poll.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"),  # the app's
    ]))
    assert [a[0] for a in answers] == [200, 422, 200, 200, 404, 200, 200]
    for status, headers, body in answers:
        if status == 200:
            assert body == via_route.content
            assert headers["content-type"] == "application/json"
            assert "date" in headers and headers["server"] == "uvicorn"
    assert answers[-1][1]["connection"] == "close"
    assert answers[1][2] and b"error" in answers[1][2]
    # The last change shows on the next poll the protocol answers.
    with svc.client(key) as c:
        assert c.delete(f"/jobs/{job}").status_code == 200
    (status, _, body), = _exchange(_port(svc), poll.replace(b"\r\n\r\n",
                                                            b"\r\nConnection: close\r\n\r\n"))
    assert status == 200 and JobStatus.model_validate_json(body).state == "cancelled"
    first = _exchange(_port(svc), poll + poll.replace(b"\r\n\r\n",
                                                     b"\r\nConnection: close\r\n\r\n"))
    assert [a[0] for a in first] == [200, 200] and first[0][2] == first[1][2] == body

    log = (svc.data_dir / "logs" / "serve.log").read_text()
    assert '"POST /similarity HTTP/1.1" 422' in log and "again=1" in log
    assert f"/jobs/{'0' * 32} HTTP/1.1\" 404" in log
    assert f'"GET /jobs/{job} HTTP/1.1" 200' not in log

    loud = service_factory.embedded(extra_env={**ENV, "STITCHSIM_ACCESS_LOG_POLLS": "true"},
                                    workers=False)
    key = loud.create_key("frank")
    job = _job(loud, key, ckpts)
    with loud.client(key) as c:
        assert c.get(f"/jobs/{job}").status_code == 200  # the route, which caches the key
    poll = f"GET /jobs/{job} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n"
    answers = _exchange(_port(loud), (2 * poll + poll.replace(
        "\r\n\r\n", "\r\nConnection: close\r\n\r\n")).encode())
    assert [a[0] for a in answers] == [200, 200, 200]
    log = (loud.data_dir / "logs" / "serve.log").read_text()
    assert log.count(f'"GET /jobs/{job} HTTP/1.1" 200') == 4


def _one_response(sock: socket.socket) -> tuple[int, bytes]:
    """Read one response (status, body) off a keep-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    n = int(re.search(rb"content-length: (\d+)", head.lower()).group(1))  # type: ignore[union-attr]
    while len(body) < n:
        body += sock.recv(65536)
    return int(head.split()[1]), body


def _metric(text: str, name: str) -> float:
    m = re.search(name + r'\{method="GET",route="/jobs/\{job_id\}"(,status="200")?\} '
                  r'([0-9.e+]+)', text)
    return float(m.group(2)) if m else 0.0


def test_a_keep_alive_poller_sees_every_commit_and_is_closed_quietly_when_idle(
        service_factory: ServiceFactory, ckpts: Any) -> None:
    """One poll per read, as a keep-alive poller sends them, is answered by the protocol before
    httptools parses it. A commit by another process (here the test's own, straight into the
    job table) shows on the very next poll: the reused body is checked against the table's
    WAL index. The connection then idles out as uvicorn's keep-alive timeout (5 s) closes it:
    quietly, no 408, counted from the last poll. The metrics count every answer, latency
    included."""
    import sqlite3

    svc = service_factory.embedded(extra_env=ENV, workers=False)
    key = svc.create_key("gina")
    job = _job(svc, key, ckpts)
    with svc.client(key) as c:
        assert c.get(f"/jobs/{job}?from=route").status_code == 200  # caches the key
    poll = f"GET /jobs/{job} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", _port(svc)), timeout=30) as sock:
        sock.sendall(poll.encode())
        status, body = _one_response(sock)
        assert status == 200 and JobStatus.model_validate_json(body).progress.done == 0
        for done in (3, 7):
            with sqlite3.connect(svc.data_dir / "stitchsim.db") as db:
                db.execute("UPDATE jobs SET stage = 'training', done = ?, total = 10 "
                           "WHERE id = ?", (done, job))
            sock.sendall(poll.encode())
            status, body = _one_response(sock)
            assert status == 200 and JobStatus.model_validate_json(body).progress.done == done
        sock.sendall(poll.encode())
        assert _one_response(sock) == (200, body)  # unchanged table: the same bytes again
        # Each poll moves the idle deadline: 7 s after the first, the connection is open.
        for _ in range(2):
            time.sleep(3.5)
            sock.sendall(poll.encode())
            assert _one_response(sock)[0] == 200
        last = time.monotonic()
        sock.settimeout(15)
        assert sock.recv(65536) == b""  # closed without a response
        assert 4.0 < time.monotonic() - last < 8.0
    text = httpx.get(svc.url + "/metrics", timeout=10).text
    answered = _metric(text, "stitchsim_http_requests_total")
    assert answered >= 7
    assert _metric(text, "stitchsim_http_request_duration_seconds_count") == answered
    assert 0 < _metric(text, "stitchsim_http_request_duration_seconds_sum") < answered


def test_malformed_polls_get_what_httptools_answers(service_factory: ServiceFactory,
                                                    ckpts: Any) -> None:
    """A read that only looks like a plain poll is left to httptools and the route: 400 for what
    HTTP forbids (httptools' own plain-text answer), the contract's 401 for a key it refuses,
    never a 500 and never a job's status for a wrong key."""
    svc = service_factory.embedded(extra_env=ENV, workers=False)
    key = svc.create_key("hana")
    job = _job(svc, key, ckpts)
    with svc.client(key) as c:
        assert c.get(f"/jobs/{job}").status_code == 200  # caches the key
    base = f"GET /jobs/{job} HTTP/1.1\r\nHost: x\r\n"
    cases = {
        base + f"Authorization: Bearer {key}\r\n\r\n": 200,
        base + f"Authorization: Bearer {key}\r\nX-A: a\x00b\r\n\r\n": 400,  # NUL byte
        base + f"Authorization: Bearer\r\n {key}\r\n\r\n": 400,  # folded header line
        base.replace("\r\n", "\n") + f"Authorization: Bearer {key}\n\n": 400,  # bare LF
        base + f"Authorization : Bearer {key}\r\n\r\n": 400,  # space before the colon
        base + f"Authorization: Bearer wrong\r\nAuthorization: Bearer {key}\r\n\r\n": 401,
        base + "Authorization: Bearer sk_nope\r\n\r\n": 401,
        base + f"Authorization: Bearer {key}\r\nContent-Length: 2\r\n\r\nhi": 200,  # the route
    }
    for raw, want in cases.items():
        with socket.create_connection(("127.0.0.1", _port(svc)), timeout=30) as sock:
            sock.sendall(raw.encode("latin-1"))
            status, body = _one_response(sock)
        assert status == want, (raw, status, body)
        if status == 401:
            assert json.loads(body)["error"]["code"] == "unauthorized"
    assert "Traceback" not in svc.logs()
