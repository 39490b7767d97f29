"""Issue 38.1: the README's demo hung with its second job queued forever, and `serve` took
over 20 s to stop. Real `serve` (embedded broker), real Celery pools, real torch jobs.

The cause: the idle release stops a pool process with SIGTERM. billiard's exiting process
then writes a DEATH note to the pool's result pipe, under a lock every pool process shares,
with SIGTERM blocked in its main thread only; the Celery parent answers the note with
another SIGTERM. A process that ran a job has torch's threads: one of them took that signal,
whose action was by then the default one, and the process died holding the lock. The next
pool process took the next job from the pipe and blocked for ever on its first write (the ACK),
so the job stayed queued, the worker idle, and the reaper's re-sends were never taken either.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.fixtures_service import ServiceHandle, _children
from tests.service.conftest import submit, tiny_spec, upload
from tests.service.helpers import wait_for

# The cheapest job: least squares (no training), one point, one protocol; it still imports
# and runs torch in the pool process, which is what leaves threads there.
CHEAP = {"objectives": ["dm"], "protocols": ["standard"],
         "train": {"epochs": 1, "max_train_samples": 100, "max_test_samples": 100, "seed": 3}}
LONG = {"train": {"epochs": 30, "max_train_samples": 1000, "max_test_samples": 100, "seed": 3}}

# torch's intra-op threads, as on any machine with more than one core (the suite may run with
# OMP_NUM_THREADS=1, which would leave the pool process single-threaded).
THREADED = {"OMP_NUM_THREADS": "2"}


@contextlib.contextmanager
def cpu_load() -> Iterator[None]:
    """A busy process beside the service for the block: the report's "other work on the
    machine"."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        burner.kill()
        burner.wait()


def pool_children(svc: ServiceHandle, queue: str = "gpu") -> list[int]:
    return [c for parent in svc.worker_pids(queue) for c in _children(parent)
            if _alive(c)]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def state_of(svc: ServiceHandle, job: str) -> dict[str, Any]:
    with svc.client() as c:
        return dict(c.get(f"/jobs/{job}").json())


def test_jobs_after_an_idle_release_are_picked_up(service_factory: Any, untrained: Any) -> None:
    # The demo's sequence, shortened: a job, the pool process released when idle, the next
    # job; three times over, with the machine loaded.
    svc = service_factory.embedded(extra_env={"STITCHSIM_WORKER_IDLE_RELEASE_S": "1",
                                              **THREADED})
    with svc.client() as c:
        models = ({"checkpoint": upload(c, untrained.front)},
                  {"checkpoint": upload(c, untrained.back)})
    taken = []
    with cpu_load():
        for _ in range(3):
            job = submit(svc, tiny_spec(*models, **CHEAP))
            start = time.monotonic()
            # Picked up: a pool process claimed it (attempt 1). The hang left it queued for
            # good; a claim takes seconds plus a fork, even on two loaded cores.
            wait_for("the job to be started", lambda job=job: state_of(svc, job)["attempts"],
                       timeout=150, svc=svc)
            taken.append(time.monotonic() - start)
            final = svc.wait_job(job, timeout=300)[-1]
            assert final["state"] == "succeeded" and final["attempts"] == 1, final
            # Idle for a second: the pool process is released (with SIGTERM) before the next.
            wait_for("the idle pool process to exit", lambda: not pool_children(svc),
                       timeout=60, svc=svc)
    print("seconds from submission to start:", [round(t, 1) for t in taken])
    assert "requeueing job" not in svc.logs(10**7)


def test_a_job_a_stuck_worker_took_fails_with_the_reason(service_factory: Any,
                                                          untrained: Any) -> None:
    # A worker that takes a job and never starts it, while it runs nothing: its pool process
    # stopped (SIGSTOP), as the lock left held stopped it. The job must not wait in silence.
    svc = service_factory.embedded(extra_env={"STITCHSIM_WORKER_IDLE_RELEASE_S": "0",
                                              "STITCHSIM_PICKUP_TIMEOUT_S": "6"})
    with svc.client() as c:
        models = ({"checkpoint": upload(c, untrained.front)},
                  {"checkpoint": upload(c, untrained.back)})
    [child] = wait_for("the kept pool process", lambda: pool_children(svc), 60, svc)
    os.kill(child, signal.SIGSTOP)
    try:
        job = submit(svc, tiny_spec(*models, **CHEAP))
        start = time.monotonic()
        final = svc.wait_job(job, timeout=120)[-1]
        took = time.monotonic() - start
    finally:
        os.kill(child, signal.SIGCONT)
    assert final["state"] == "failed", final
    error = final["error"]
    assert error["code"] == "not_picked_up", error
    assert error["details"]["worker"].startswith("gpu@"), error
    assert "was not started" in error["message"] and "ran nothing" in error["message"]
    assert final["attempts"] == 0  # nothing of it ran
    logs = svc.logs(10**7)
    assert "failing the job with not_picked_up" in logs and job in logs
    # Stale delivery (4 s), a reap round, the pickup timeout (6 s) and a reap round: well
    # under a minute, not for as long as the worker lives.
    assert took < 60, took
    print(f"a job a stuck worker took failed with not_picked_up after {took:.1f} s")
    # The worker, going again, skips the failed job and runs the next one.
    nxt = submit(svc, tiny_spec(*models, **CHEAP))
    assert svc.wait_job(nxt, timeout=300)[-1]["state"] == "succeeded"


def test_serve_stops_within_10_s_of_sigterm(service_factory: Any, untrained: Any) -> None:
    # The worst moment: a job running, a client streaming its events, the workers' grace at
    # its default (10 s), pool processes with torch's threads.
    svc = service_factory.embedded(extra_env={"STITCHSIM_SHUTDOWN_GRACE_S": "10",
                                              "STITCHSIM_WORKER_IDLE_RELEASE_S": "0",
                                              **THREADED})
    with svc.client() as c:
        models = ({"checkpoint": upload(c, untrained.front)},
                  {"checkpoint": upload(c, untrained.back)})
    job = submit(svc, tiny_spec(*models, **LONG))
    svc.wait_job(job, states=("running",), interval=0.1)
    serve = svc.procs["serve"]
    workers = svc.worker_pids("gpu") + svc.worker_pids("checks")
    tree = [serve.pid, *workers, *(c for w in workers for c in _children(w))]
    assert len(tree) >= 5, tree  # serve, two workers, their pool processes

    def stream() -> None:
        with contextlib.suppress(httpx.HTTPError), svc.client(timeout=60) as c, \
                c.stream("GET", f"/jobs/{job}/events") as r:
            for _ in r.iter_lines():
                pass

    streaming = threading.Thread(target=stream, daemon=True)
    streaming.start()
    time.sleep(1.0)
    start = time.monotonic()
    serve.send_signal(signal.SIGTERM)  # serve only, as `kill` in the demo's trap does
    deadline = start + 30
    while time.monotonic() < deadline and any(_alive(p) for p in tree):
        time.sleep(0.05)
    took = time.monotonic() - start
    left = [p for p in tree if _alive(p)]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    serve.wait(10)
    svc.procs.pop("serve")
    print(f"serve and its {len(tree) - 1} worker processes gone {took:.1f} s after SIGTERM")
    assert not left, f"still running {took:.1f} s after SIGTERM: {left}"
    assert took < 10, took
    # Nothing lost: the job is still in the table, for the next start to run again.
    from sqlalchemy import create_engine, text

    engine = create_engine(svc.database_url)
    try:
        with engine.connect() as conn:
            state = conn.execute(text("SELECT state FROM jobs WHERE id = :id"),
                                 {"id": job}).scalar()
    finally:
        engine.dispose()
    assert state in ("running", "queued"), state
