"""Jobs that fail in a real Celery worker, each for a real reason, and what the job status, the
SDK and the CLI then say; and pool processes released when idle.

- time_limit: a worker whose STITCHSIM_JOB_TIME_LIMIT_S leaves a 1 s soft limit;
- out_of_memory: an address-space limit (RLIMIT_AS) put on the pool process from outside,
  as a container's memory cap would;
- worker_broken: a worker whose torch cannot be imported (a broken install on its path);
- idle release: with STITCHSIM_WORKER_IDLE_RELEASE_S the pool process exits when idle, the
  idle worker holds no torch, and the next job forks a new one and runs.

One service (Redis mode, spec checks off: nothing here is about them); each test starts the
gpu worker it needs, configured by its environment, and stops it.
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from stitchsim import Client
from stitchsim.cli import exit_code_for, main
from stitchsim.errors import JobFailed

from tests.fixtures_service import ServiceFactory, ServiceHandle
from tests.service.conftest import submit, tiny_spec, upload
from tests.service.helpers import wait_for

# The cheapest job there is: least squares (no training), one point, one protocol.
CHEAP = {"objectives": ["dm"], "protocols": ["standard"],
         "train": {"epochs": 1, "max_train_samples": 100, "max_test_samples": 100, "seed": 3}}
# Several seconds of training at least: longer than a 1 s time limit however fast the machine.
LONG = {"train": {"epochs": 20, "max_train_samples": 1000, "max_test_samples": 100, "seed": 3}}


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceHandle]:
    factory = ServiceFactory(tmp_path_factory)
    yield factory.redis(extra_env={"STITCHSIM_CHECK_TIMEOUT_S": "0"}, workers=False)
    factory.close()


@pytest.fixture(scope="module")
def models(svc: ServiceHandle, untrained: Any) -> tuple[dict[str, str], dict[str, str]]:
    with svc.client() as c:
        return ({"checkpoint": upload(c, untrained.front)},
                {"checkpoint": upload(c, untrained.back)})


@contextlib.contextmanager
def gpu_worker(svc: ServiceHandle, env: dict[str, str]) -> Iterator[int]:
    """A gpu worker configured by env while the block runs; yields its pid (the Celery parent,
    whose children are the pool processes)."""
    svc.start_worker("gpu", env)
    try:
        svc.wait_ready(queues=("gpu",))
        yield svc.procs["worker_gpu"].pid
    finally:
        svc.stop_process("worker_gpu")  # warm shutdown: it deregisters


def live_children(pid: int) -> list[int]:
    """Pool processes of pid that have not exited (zombies left out)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(stat.parent.name))
    return out


def maps_torch(pid: int) -> bool:
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


def failed_with(svc: ServiceHandle, job_id: str, code: str) -> dict[str, Any]:
    # A wait for the event, not a bound on how fast it comes: on a loaded 2-core machine a job
    # has sat queued for over 90 s behind the pool process's torch import.
    final = svc.wait_job(job_id, timeout=300)[-1]
    assert final["state"] == "failed", final
    assert final["error"]["code"] == code, f"the whole error: {final['error']}"
    return dict(final["error"])


def assert_cli_and_sdk_say(svc: ServiceHandle, job_id: str, code: str,
                           capsys: pytest.CaptureFixture[str]) -> None:
    """The SDK raises JobFailed with the code; the CLI exits 3 (not the user's fault)."""
    with Client(svc.url, svc.api_key) as client, pytest.raises(JobFailed) as info:
        client.job(job_id).wait(timeout=30)
    assert info.value.code == code and not info.value.is_user_error
    assert exit_code_for(info.value) == 3
    capsys.readouterr()
    assert main(["jobs", "wait", job_id, "--url", svc.url, "--api-key", str(svc.api_key),
                 "--progress", "none"]) == 3
    assert f"({code})" in capsys.readouterr().err


def test_a_job_past_its_time_limit_fails_with_time_limit(
    svc: ServiceHandle, models: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # 31 s hard limit, so the soft one (30 s earlier) is 1 s; the engine is loaded when the
    # pool process starts (idle release off), so the second runs out inside the job itself.
    env = {"STITCHSIM_JOB_TIME_LIMIT_S": "31", "STITCHSIM_WORKER_IDLE_RELEASE_S": "0"}
    with gpu_worker(svc, env) as parent:
        [child] = wait_for("a pool process with the engine loaded",
                           lambda: [p for p in live_children(parent) if maps_torch(p)], svc=svc)
        job = submit(svc, tiny_spec(*models, **LONG))
        error = failed_with(svc, job, "time_limit")
        assert child in live_children(parent)  # stopped cleanly: the process lives on
    assert "past its time limit of 1 s" in error["message"]
    assert "STITCHSIM_JOB_TIME_LIMIT_S" in error["message"]
    assert_cli_and_sdk_say(svc, job, "time_limit", capsys)


def test_a_job_out_of_memory_fails_with_out_of_memory(
    svc: ServiceHandle, models: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with gpu_worker(svc, {"STITCHSIM_WORKER_IDLE_RELEASE_S": "0"}) as parent:
        [child] = wait_for("a pool process with the engine loaded",
                           lambda: [p for p in live_children(parent) if maps_torch(p)], svc=svc)
        # A kept pool process warms up (imports every model source) after torch is mapped.
        wait_for("the pool process to warm up",
                 lambda: f"pool process {child} warmed up" in svc.logs(tail=200_000), svc=svc)
        size = wait_for("the pool process to finish loading", lambda: _steady_vm_bytes(child),
                        svc=svc)
        # A memory cap on the process that computes: the engine as loaded, room for the job's
        # threads and bookkeeping, and less than its batches need.
        soft, hard = resource.prlimit(child, resource.RLIMIT_AS)
        resource.prlimit(child, resource.RLIMIT_AS, (size + OOM_ROOM, hard))
        try:
            job = submit(svc, tiny_spec(*(_at(m, BIG_INPUTS) for m in models), **BIG_BATCHES))
            error = failed_with(svc, job, "out_of_memory")
        finally:
            with contextlib.suppress(ProcessLookupError):
                resource.prlimit(child, resource.RLIMIT_AS, (soft, hard))
    assert "ran out of memory" in error["message"]
    assert_cli_and_sdk_say(svc, job, "out_of_memory", capsys)


# A thread's stack (8 MiB) and its malloc arena (64 MiB reserved) count in the address space:
# the job's heartbeat thread must start, or the job fails before it computes anything.
OOM_ROOM = 350 * 1024**2
# Whole-split batches at 64 px: about four times the 480 MiB of address space that 32 px
# batches take beyond the loaded engine. At 32 px a warmed-up pool process (every model
# source imported, the built-in data loaded once) found most of it already mapped and freed.
BIG_BATCHES = {"train": {"epochs": 1, "max_train_samples": 1400, "max_test_samples": 100,
                         "batch_size": 8192, "seed": 3}}
BIG_INPUTS = 64


def _at(ref: dict[str, Any], size: int) -> dict[str, Any]:
    return {**ref, "input_size": size}


def _vm_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmSize for {pid}")


def _steady_vm_bytes(pid: int) -> int | None:
    """The process's address space once it stopped growing for a second (its imports done)."""
    sizes = []
    for _ in range(5):
        sizes.append(_vm_bytes(pid))
        time.sleep(0.25)
    return sizes[0] if len(set(sizes)) == 1 else None


def test_a_worker_that_cannot_load_its_engine_fails_jobs_with_worker_broken(
    svc: ServiceHandle, models: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A torch that cannot be imported, first on the worker's path: what a broken install or a
    # missing CUDA library does. The worker itself (Celery, the job table) never imports it.
    broken = tmp_path / "broken-site" / "torch"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text(
        'raise ImportError("libtorch_cpu.so: cannot open shared object file")\n')
    path = os.pathsep.join(p for p in (str(broken.parent), os.environ.get("PYTHONPATH")) if p)
    with gpu_worker(svc, {"PYTHONPATH": path}):
        job = submit(svc, tiny_spec(*models, **CHEAP))
        error = failed_with(svc, job, "worker_broken")
    assert error["message"].startswith("the worker cannot load its compute engine: ")
    assert "libtorch_cpu.so: cannot open shared object file" in error["message"]
    assert_cli_and_sdk_say(svc, job, "worker_broken", capsys)


def test_idle_pool_processes_are_released_and_forked_again(svc: ServiceHandle,
                                                           models: Any) -> None:
    with gpu_worker(svc, {"STITCHSIM_WORKER_IDLE_RELEASE_S": "1"}) as parent:
        assert live_children(parent) == []  # nothing forked before a task
        pids = []
        for _ in range(2):
            job = submit(svc, tiny_spec(*models, **CHEAP))
            [pid] = wait_for("a pool process for the job", lambda: live_children(parent),
                             svc=svc)
            pids.append(pid)
            assert svc.wait_job(job, timeout=300)[-1]["state"] == "succeeded"
            # Idle for a second: the pool process goes, and with it torch.
            wait_for("the idle pool process to exit", lambda: not live_children(parent),
                     timeout=30, svc=svc)
            assert not maps_torch(parent)
        assert pids[0] != pids[1]
