"""`serve` owns its workers: SIGKILL of serve takes its workers and their pool children with it,
and a restarted serve never runs a second worker under a node name that is still alive."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from tests.fixtures_service import _children
from tests.service.conftest import submit, tiny_spec, upload


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


def _tree(pids: list[int]) -> list[int]:
    return [q for p in pids for q in (p, *_children(p))]


def _wait_gone(pids: list[int], timeout: float) -> tuple[float, list[int]]:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        left = [p for p in pids if _alive(p)]
        if not left:
            return time.monotonic() - start, []
        time.sleep(0.2)
    return time.monotonic() - start, [p for p in pids if _alive(p)]


def test_sigkill_of_serve_takes_its_workers_along(service_factory, ckpts) -> None:  # type: ignore[no-untyped-def]
    svc = service_factory.embedded()
    with svc.client() as c:
        front = upload(c, ckpts.digits_resnet)
        back = upload(c, ckpts.digits_resnet_b)
    spec = tiny_spec({"checkpoint": front}, {"checkpoint": back})
    running = submit(svc, {**spec, "train": {**spec["train"], "epochs": 30,
                                              "max_train_samples": 400}})
    svc.wait_job(running, states=("running",), interval=0.05)
    workers = svc.worker_pids("gpu") + svc.worker_pids("checks")
    tree = _tree(workers)
    assert len(workers) == 2 and len(tree) >= 4, (workers, tree)  # parents + pool children

    serve = svc.procs.pop("serve")
    os.kill(serve.pid, signal.SIGKILL)  # the process only, as the OOM killer does
    serve.wait(10)
    took, orphans = _wait_gone(tree, timeout=30)
    try:
        assert not orphans, f"still running {took:.1f} s after serve was killed: {orphans}"
    finally:
        for pid in orphans:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    # The grace period is 1 s in tests: the workers are gone within seconds, not at job end.
    assert took < 15, took

    print(f"serve SIGKILLed: its {len(tree)} worker processes gone after {took:.1f} s")

    svc.start()
    svc.wait_ready()
    # The reaper puts the killed attempt back; the new worker runs it (then it may stop).
    with svc.client() as c:
        deadline = time.monotonic() + 120
        status = c.get(f"/jobs/{running}").json()
        while status["attempts"] < 2 and status["state"] != "succeeded":
            assert time.monotonic() < deadline, status
            time.sleep(0.2)
            status = c.get(f"/jobs/{running}").json()
        c.delete(f"/jobs/{running}")
    assert len(svc.worker_pids("gpu")) == 1
    _second_worker_under_a_live_name_is_refused(svc)


def _second_worker_under_a_live_name_is_refused(svc) -> None:  # type: ignore[no-untyped-def]
    import subprocess

    from tests.fixtures_service import cli_command

    gpu = svc.worker_pids("gpu")
    # A second worker under serve's node name while serve's worker lives: refused, not run.
    env = {**svc.env, "STITCHSIM_SHUTDOWN_GRACE_S": "0"}
    started = time.monotonic()
    out = subprocess.run(cli_command("worker", "--queues", "gpu", "--name", "gpu@%h"), env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "already running" in out.stderr and str(gpu[0]) in out.stderr, out.stderr[-2000:]
    assert time.monotonic() - started < 30
    assert svc.worker_pids("gpu") == gpu


def test_a_job_killed_with_serve_is_requeued_at_the_restart(service_factory, ckpts) -> None:  # type: ignore[no-untyped-def]
    """Issue 49: after serve was killed mid-job, the restarted service showed the job running
    for the stale-heartbeat window (45 s) while a queued job overtook it. The heartbeat window
    here is 10 minutes: only the restarted worker, which holds the node name, can requeue."""
    svc = service_factory.embedded(extra_env={"STITCHSIM_STALE_AFTER_S": "600"})
    with svc.client() as c:
        front = upload(c, ckpts.digits_resnet)
        back = upload(c, ckpts.digits_resnet_b)
    spec = tiny_spec({"checkpoint": front}, {"checkpoint": back})
    running = submit(svc, {**spec, "train": {**spec["train"], "epochs": 30,
                                              "max_train_samples": 400}})
    svc.wait_job(running, states=("running",), interval=0.05)
    tree = _tree(svc.worker_pids("gpu") + svc.worker_pids("checks"))
    serve = svc.procs.pop("serve")
    os.kill(serve.pid, signal.SIGKILL)
    serve.wait(10)
    _, orphans = _wait_gone(tree, timeout=30)
    assert not orphans, orphans
    svc.start()
    svc.wait_ready()
    started = time.monotonic()
    with svc.client() as c:
        status = c.get(f"/jobs/{running}").json()
        while status["attempts"] < 2 and status["progress"]["stage"] != "requeued":
            assert time.monotonic() - started < 30, status  # not the 600 s heartbeat window
            time.sleep(0.2)
            status = c.get(f"/jobs/{running}").json()
        took = time.monotonic() - started
        c.delete(f"/jobs/{running}")
    print(f"job killed with serve: requeued {took:.1f} s after the restarted service was ready "
          f"(state {status['state']}, stage {status['progress']['stage']}, attempts "
          f"{status['attempts']})")
