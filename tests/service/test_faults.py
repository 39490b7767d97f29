"""Faults (issue 8), with real processes and real faults (signals, rlimits, file flags):

- a gpu worker SIGKILLed mid-IRI synthesis and mid-training: the job completes on a restarted
  worker with the report of an undisturbed run;
- a job whose worker dies every time ends `failed` after the attempt cap, and stays failed;
- Redis (append-only, fsync always) crashed and restarted mid-job: no job lost, none run twice;
- the gateway SIGKILLed mid-upload: no partial object, row or temp file afterwards;
- a full or unwritable store: 503 with a reason and Retry-After, a job that cannot write its
  report fails with one, and nothing stored before is harmed.
"""

from __future__ import annotations

import contextlib
import hashlib
import resource
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
from stitchsim.models import Spec
from stitchsim_service.core.store import object_key
from stitchsim_service.core.tmpfiles import new_upload_path

from tests.fixtures_service import FAST_ENV, ServiceHandle, free_port
from tests.service.conftest import (
    assert_same_figures,
    figures,
    job_report,
    submit,
    tiny_spec,
    upload,
)
from tests.service.helpers import (
    TINY_SPEC,
    assert_error_body,
    raw_safetensors,
    safetensors_bytes,
    service_state,
)

TERMINAL = ("succeeded", "failed", "cancelled")
MiB = 1024 * 1024

# Invariance-aware, so a job has an IRI stage and a training stage, each a few seconds long on
# two busy cores: long enough to be caught by a fast poll, short enough to run twice.
KILL_SPEC = {
    "protocols": ["invariance_aware"],
    "train": {"epochs": 40, "max_train_samples": 200, "max_test_samples": 100, "seed": 3},
    "iri": {"method": "fast", "steps": 40},  # the stage lengths measured under fast
}
# Each kill test pays for its job three times (the killed attempt, the restart, the in-process
# reference), so only the stage that is killed is long: killed mid-IRI, one epoch of training
# follows; killed mid-training, the IRIs before it are a short first round with no extra rounds
# (their convergence is not what the test is about, the same IRIs on restart are).
KILL_STAGE_SPEC: dict[str, dict[str, Any]] = {
    "iri": {**KILL_SPEC, "train": {**KILL_SPEC["train"], "epochs": 1}},
    "train": {**KILL_SPEC, "iri": {**KILL_SPEC["iri"], "steps": 5, "extra_rounds": 0}},
}


# ---------------------------------------------------------------- helpers


def _ids(svc: ServiceHandle, ckpts: Any) -> tuple[dict[str, str], dict[str, str]]:
    with svc.client() as c:
        return ({"checkpoint": upload(c, ckpts.digits_resnet)},
                {"checkpoint": upload(c, ckpts.digits_resnet_b)})


def _status(svc: ServiceHandle, job_id: str) -> dict[str, Any]:
    with svc.client() as c:
        r = c.get(f"/jobs/{job_id}")
    r.raise_for_status()
    return dict(r.json())


def _wait_until(svc: ServiceHandle, job_id: str, ok: Any, what: str,
                timeout: float = 240) -> dict[str, Any]:
    """Poll the job fast until ok(status); fail if it ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = _status(svc, job_id)
        if ok(status):
            return status
        assert status["state"] not in TERMINAL, f"job ended before {what}: {status}"
        time.sleep(0.02)
    raise AssertionError(f"job {job_id} never reached {what}\n{svc.logs()}")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha256(path: Path) -> str:
    return _sha256(path.read_bytes())


def _random_checkpoint(size: int) -> bytes:
    """A valid safetensors file of about size bytes, never uploaded before (random weights)."""
    rng = np.random.default_rng()
    return safetensors_bytes({"w": rng.standard_normal(size // 4, dtype=np.float32)})


def _post_checkpoint(svc: ServiceHandle, data: bytes) -> httpx.Response:
    with svc.client() as c:
        return c.post("/checkpoints", content=data,
                      headers={"content-type": "application/octet-stream"})


def _assert_no_trace(svc: ServiceHandle, object_id: str, before: Any) -> None:
    """A failed upload left nothing: no object or part file in the store, no temp file, no
    row (before: service_state before it)."""
    assert service_state(svc) == before
    with svc.client() as c:
        assert c.get(f"/checkpoints/{object_id}").status_code == 404


@dataclass
class Finished:
    """A checkpoint and a report stored before a fault, to check nothing harmed them."""

    checkpoint_id: str
    checkpoint_sha256: str
    job_id: str
    report: dict[str, Any]

    def assert_intact(self, svc: ServiceHandle) -> None:
        key = object_key("checkpoints", self.checkpoint_id)
        assert _file_sha256(svc.data_dir / "store" / key) == self.checkpoint_sha256
        with svc.client() as c:
            assert c.get(f"/checkpoints/{self.checkpoint_id}").status_code == 200
        assert job_report(svc, self.job_id) == self.report


@pytest.fixture(scope="module")
def finished(redis_service: ServiceHandle, ckpts: Any) -> Finished:
    front, back = _ids(redis_service, ckpts)
    job_id = submit(redis_service, tiny_spec(front, back))
    assert redis_service.wait_job(job_id)[-1]["state"] == "succeeded"
    return Finished(front["checkpoint"], _file_sha256(ckpts.digits_resnet), job_id,
                    job_report(redis_service, job_id))


# ---------------------------------------------------------------- worker killed mid-job


def _reference(ckpts: Any, spec: dict[str, Any], cache: Path) -> dict[str, Any]:
    """The same spec run undisturbed, in this process (what every restart must reproduce)."""
    from stitchsim_worker.engine import Resources, run_job

    local = {**spec, "front": {"checkpoint": {"path": str(ckpts.digits_resnet)}},
             "back": {"checkpoint": {"path": str(ckpts.digits_resnet_b)}}}
    report = run_job(Spec.model_validate(local), resources=Resources(cache_dir=cache))
    return figures(report)


def _without_cache_hit(figs: dict[str, Any]) -> dict[str, Any]:
    # Only where the IRIs came from may differ (timings are not figures): a restart after
    # training began reads the ones the killed attempt cached, the undisturbed run synthesised
    # them. No figure may differ.
    for row in figs["results"]:
        if row.get("iri"):
            row["iri"].pop("cache_hit")
    return figs


@pytest.mark.parametrize(("stage", "iri_seed"), [("iri", 8101), ("train", 8102)])
def test_worker_killed_mid_stage_completes_with_the_same_report(
        redis_service: ServiceHandle, ckpts: Any, tmp_path: Path, stage: str,
        iri_seed: int) -> None:
    svc = redis_service
    front, back = _ids(svc, ckpts)
    # An IRI seed of its own: the IRI cache starts cold for this job.
    stage_spec = KILL_STAGE_SPEC[stage]
    spec = tiny_spec(front, back, **{**stage_spec, "iri": {**stage_spec["iri"], "seed": iri_seed}})
    job_id = submit(svc, spec)

    at_kill = _wait_until(svc, job_id, lambda s: s["progress"]["stage"].startswith(stage),
                          f"stage {stage}")
    assert svc.kill_workers("gpu"), "no gpu worker to kill"
    assert _status(svc, job_id)["state"] == "running", "finished before the kill landed"
    with ThreadPoolExecutor(1) as pool:
        # The undisturbed run goes on in this process while the service recovers.
        want = pool.submit(_reference, ckpts, spec, tmp_path / "cache")
        svc.start_workers()
        final = svc.wait_job(job_id, timeout=300)[-1]
        assert final["state"] == "succeeded", final
        assert final["attempts"] == at_kill["attempts"] + 1 == 2, final
        got = figures(job_report(svc, job_id))
        # Killed mid-synthesis, the attempt cached nothing (a half-written entry would be a
        # hit); killed mid-training, it had cached complete IRIs, which the restart reuses.
        assert got["results"][0]["iri"]["cache_hit"] is (stage == "train")
        assert_same_figures(_without_cache_hit(got), _without_cache_hit(want.result()))


# ---------------------------------------------------------------- attempt cap


def test_job_that_kills_its_worker_every_time_fails_after_the_cap(
        service_factory: Any, ckpts: Any) -> None:
    max_attempts = 2
    svc = service_factory.redis(extra_env={"STITCHSIM_MAX_ATTEMPTS": str(max_attempts)})
    front, back = _ids(svc, ckpts)
    job_id = submit(svc, tiny_spec(front, back, train={**KILL_SPEC["train"], "epochs": 1000}))

    # Each attempt's pool child is killed as the OOM killer would: Celery's parent survives
    # and puts the task straight back (reject on worker lost), the loop the cap must break.
    for attempt in range(1, max_attempts + 1):
        _wait_until(svc, job_id, lambda s, n=attempt: s["state"] == "running"
                    and s["attempts"] == n, f"attempt {attempt} running")
        assert svc.kill_pool_children("gpu"), "no pool child to kill"

    final = svc.wait_job(job_id, timeout=120)[-1]
    assert final["state"] == "failed", final
    assert final["attempts"] == max_attempts
    assert final["error"]["code"] == "attempts_exhausted"
    assert f"gave up after {max_attempts} attempts" in final["error"]["message"]

    # It stays failed: longer than the reaper takes to requeue a stale job, workers alive.
    time.sleep(float(FAST_ENV["STITCHSIM_STALE_AFTER_S"]) + 3)
    assert _status(svc, job_id) == final
    assert svc.worker_pids("gpu") and redis.Redis.from_url(svc.redis_url).llen("gpu") == 0
    # Only the test killed pool children: Celery did not kill new ones for starting slowly
    # (they import torch first), which under load made them die over and over.
    assert "Timed out waiting for UP message" not in svc.logs(tail=10**7)


# ---------------------------------------------------------------- Redis restarted mid-job


@dataclass
class PrivateRedis:
    """A redis-server of this test's own: append-only with fsync on every write, or (not
    persistent) keeping nothing, so that a restart empties it."""

    port: int
    data_dir: Path
    persistent: bool = True
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        with open(self.data_dir / "redis.log", "ab") as log:
            self.proc = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                 "--dir", str(self.data_dir), "--appendonly",
                 "yes" if self.persistent else "no", "--appendfsync", "always", "--save", ""],
                stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.ConnectionError):
                if redis.Redis.from_url(self.url).ping():
                    return
            time.sleep(0.1)
        raise RuntimeError("redis-server did not start:\n"
                           + (self.data_dir / "redis.log").read_text())

    def crash(self) -> None:
        # SIGKILL: with fsync always, every write Redis acknowledged is on disk all the same.
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)


@pytest.fixture(params=[True, False], ids=["persistent", "not-persistent"])
def private_redis(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(free_port(), tmp_path, persistent=request.param)
    server.start()
    yield server
    if server.proc is not None and server.proc.poll() is None:
        server.crash()


def test_redis_restart_mid_job_loses_no_job(private_redis: PrivateRedis,
                                            service_factory: Any, ckpts: Any) -> None:
    # Persistent: the queue survives the restart. Not persistent: it comes back empty, and the
    # gateway's reaper re-sends the queued jobs from the job table (the table is the truth).
    # private_redis first: set up before the service, so it is torn down after it.
    svc = service_factory.redis(redis_url=private_redis.url)
    front, back = _ids(svc, ckpts)
    running = submit(svc, tiny_spec(front, back, train={**KILL_SPEC["train"], "epochs": 100}))
    _wait_until(svc, running, lambda s: s["state"] == "running", "running")
    # The queued jobs only have to wait out the restart and then run once: the tiny spec's one
    # epoch, each with a seed of its own (so none is the same job as another).
    queued = [submit(svc, tiny_spec(front, back, train={**TINY_SPEC["train"], "seed": seed}))
              for seed in (11, 12, 13)]
    assert _status(svc, running)["state"] == "running", "too short to outlive the restart"

    private_redis.crash()
    time.sleep(1)
    private_redis.start()

    for job_id in [running, *queued]:
        final = svc.wait_job(job_id, timeout=300)[-1]
        assert final["state"] == "succeeded", final
        assert final["attempts"] == 1, final  # a second run would be a second claim
    # Redelivered messages may exist (a restart restores unacknowledged ones); the job table
    # must have dropped them: one run to completion per job, none superseded.
    logs = svc.logs(tail=10**7)
    assert all(logs.count(f"job {j}: succeeded") == 1 for j in [running, *queued]), logs
    assert "superseded" not in logs
    if not private_redis.persistent:
        # The queue came back empty: only the reaper's re-sends can have run the queued jobs.
        assert any(f"requeueing job {j}" in logs for j in queued), logs[-4000:]


# ---------------------------------------------------------------- gateway killed mid-upload


class _SlowUpload:
    """A raw checkpoint upload that sends its first bytes, then stalls until told to go on."""

    def __init__(self, declared: int, first: int):
        meta = {"w": {"dtype": "F32", "shape": [declared // 4], "data_offsets": [0, declared]}}
        self.head = raw_safetensors(meta)
        self.declared, self.first = declared, first
        self.go_on = threading.Event()
        self.outcome: httpx.Response | httpx.HTTPError | None = None
        self.thread: threading.Thread | None = None

    def _body(self) -> Iterator[bytes]:
        yield self.head
        chunk = bytes(MiB)
        for sent in range(0, self.declared, MiB):
            if sent == self.first:
                self.go_on.wait(120)
            yield chunk

    def _send(self, svc: ServiceHandle) -> None:
        try:
            with svc.client(timeout=180) as c:
                self.outcome = c.post("/checkpoints", content=self._body(),
                                      headers={"content-type": "application/octet-stream"})
        except httpx.HTTPError as exc:
            self.outcome = exc

    def start(self, svc: ServiceHandle) -> None:
        self.thread = threading.Thread(target=self._send, args=(svc,), daemon=True)
        self.thread.start()

    def finish(self) -> httpx.Response | httpx.HTTPError | None:
        self.go_on.set()
        assert self.thread is not None
        self.thread.join(60)
        return self.outcome


def _spool_files(svc: ServiceHandle) -> list[Path]:
    return sorted((svc.data_dir / "tmp").glob("upload-*.part"))


def test_gateway_killed_mid_upload_leaves_nothing(redis_service: ServiceHandle,
                                                  finished: Finished) -> None:
    svc = redis_service
    before = service_state(svc)
    # A temp file of a live upload elsewhere (this process, this host): the restarted gateway
    # must leave it alone, since gateways may share a data dir.
    live = new_upload_path(svc.data_dir / "tmp")
    live.write_bytes(b"someone else's upload in progress")

    upload_ = _SlowUpload(declared=24 * MiB, first=8 * MiB)
    upload_.start(svc)
    deadline = time.monotonic() + 60
    while not [p for p in _spool_files(svc) if p != live and p.stat().st_size >= 4 * MiB]:
        assert time.monotonic() < deadline, f"the upload never reached the disk\n{svc.logs()}"
        time.sleep(0.05)
    partial = next(p for p in _spool_files(svc) if p != live)

    svc.stop_process("gateway", signal.SIGKILL)
    outcome = upload_.finish()
    assert isinstance(outcome, httpx.HTTPError), outcome  # cut off, never answered
    assert partial.exists()  # what the kill left behind; the restart must clean it up

    svc.start_gateway()
    svc.wait_ready()
    assert not partial.exists()
    assert live.exists()
    live.unlink()
    assert service_state(svc) == before
    finished.assert_intact(svc)


# ---------------------------------------------------------------- full or unwritable store


def _assert_store_unavailable(r: httpx.Response, reason: str) -> None:
    assert r.status_code == 503, r.text
    assert int(r.headers["retry-after"]) > 0
    error = assert_error_body(r)
    assert error["code"] == "store_unavailable"
    assert reason in error["message"] and "an operator must" in error["message"], error


def test_disk_full_upload_is_503_and_corrupts_nothing(redis_service: ServiceHandle,
                                                      finished: Finished) -> None:
    svc = redis_service
    data = _random_checkpoint(12 * MiB)
    object_id = f"sha256:{_sha256(data)}"
    gateway = svc.procs["gateway"].pid
    # A file size limit on the gateway: writing past it fails with EFBIG, as a full disk fails
    # with ENOSPC (CPython ignores SIGXFSZ). The job table (PostgreSQL, or a SQLite file far
    # smaller than the limit) and the logs stay writable.
    limits = resource.prlimit(gateway, resource.RLIMIT_FSIZE)
    resource.prlimit(gateway, resource.RLIMIT_FSIZE, (8 * MiB, limits[1]))
    try:
        before = service_state(svc)
        _assert_store_unavailable(_post_checkpoint(svc, data), "is full")
        _assert_no_trace(svc, object_id, before)
    finally:
        resource.prlimit(gateway, resource.RLIMIT_FSIZE, limits)  # the operator freed space

    r = _post_checkpoint(svc, data)
    assert r.status_code == 201 and r.json()["id"] == object_id, r.text
    assert _file_sha256(svc.data_dir / "store" / object_key("checkpoints", object_id)) \
        == object_id[7:]
    finished.assert_intact(svc)


@contextlib.contextmanager
def _immutable(directory: Path) -> Iterator[None]:
    """chattr +i: not even root may create files in directory (our tests run as root)."""
    directory.mkdir(parents=True, exist_ok=True)
    if shutil.which("chattr") is None or subprocess.run(
            ["chattr", "+i", str(directory)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here (filesystem or capability)")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True)


def test_unwritable_store_is_503_and_fails_jobs_with_a_reason(
        redis_service: ServiceHandle, ckpts: Any, finished: Finished) -> None:
    svc = redis_service
    data = _random_checkpoint(MiB)
    object_id = f"sha256:{_sha256(data)}"
    shard = (svc.data_dir / "store" / object_key("checkpoints", object_id)).parent
    spool = svc.data_dir / "tmp"
    for directory, reason in ((spool, "the upload spool (STITCHSIM_DATA_DIR/tmp) is not writable"),
                              (shard, "the blob store is not writable")):
        before = service_state(svc)
        with _immutable(directory):
            _assert_store_unavailable(_post_checkpoint(svc, data), reason)
            _assert_no_trace(svc, object_id, before)
    r = _post_checkpoint(svc, data)
    assert r.status_code == 201 and r.json()["id"] == object_id, r.text

    # A worker that cannot write the report: the job must not end succeeded.
    front, back = _ids(svc, ckpts)
    with _immutable(svc.data_dir / "store" / "reports"):
        job_id = submit(svc, tiny_spec(front, back, train={**KILL_SPEC["train"], "epochs": 2}))
        final = svc.wait_job(job_id)[-1]
    assert final["state"] == "failed", final
    assert final["error"]["code"] == "store_unavailable"
    assert "is not writable" in final["error"]["message"]
    assert final["attempts"] == 1
    finished.assert_intact(svc)
