"""The client's failure paths, each once against the real service with a real fault (the fake
service's tests cover their every branch): a 429 from a real per-key quota waited out as its
Retry-After says, backoff through a gateway that is down, a resubmission under the same
Idempotency-Key, a CLI check riding out a gateway killed and restarted on the same port and
ending in NO VERDICT (exit 2), exit 3 for a real 429, and exit 4 (the job cancelled) when no
worker runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from stitchsim import Client
from stitchsim.cli import exit_code_for
from stitchsim.errors import Conflict, RateLimited

from tests.fixtures_service import ServiceFactory, ServiceHandle, cli_command

LAYER = [{"front": "layer1", "back": "layer1"}]
# The cheapest job there is: least squares (no training), one point, one protocol, few samples.
CHEAP = {"layers": LAYER, "objectives": ["dm"], "protocols": ["standard"],
         "directions": "front_to_back",
         "train": {"epochs": 1, "max_train_samples": 100, "max_test_samples": 100}}


def _key_with_limits(svc: ServiceHandle, name: str, *flags: str) -> str:
    out = subprocess.run(cli_command("keys", "create", name, *flags), env=svc.env,
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return next(line.split()[-1] for line in out.splitlines() if line.startswith("key:"))


def _jobs(svc: ServiceHandle, key: str) -> list[dict[str, Any]]:
    with svc.client(key) as http:
        return list(http.get("/jobs", params={"limit": 100}).json()["items"])


# ---------------------------------------------------------------- a real quota (gateway alone)


def test_a_real_429_is_waited_out_as_retry_after_says(gateway_service: ServiceHandle,
                                                      untrained: Any) -> None:
    svc = gateway_service
    key = _key_with_limits(svc, "one-job", "--max-jobs", "1")
    with Client(svc.url, key) as client:
        first = client.compare(untrained.front, untrained.back, **CHEAP)

        # One job in flight is this key's quota: the next submission is answered 429 with
        # Retry-After 1 (STITCHSIM_QUOTA_RETRY_AFTER_S). The slot is freed while the client
        # waits, as another job of the key ending would.
        waits: list[float] = []

        def sleep(seconds: float) -> None:
            waits.append(seconds)
            first.cancel()
            time.sleep(seconds)

        client.http.sleep = sleep
        start = time.monotonic()
        second = client.compare(untrained.front, untrained.back, **CHEAP)
        elapsed = time.monotonic() - start
    assert waits == [1.0]
    assert elapsed >= 1.0
    # The retried submission made one job, not two.
    assert [(j["id"], j["state"]) for j in _jobs(svc, key)] == [
        (second.id, "queued"), (first.id, "cancelled")]


def test_a_real_429_beyond_max_retry_after_or_retries_is_raised(
    gateway_service: ServiceHandle, untrained: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    svc = gateway_service
    key = _key_with_limits(svc, "one-job-b", "--max-jobs", "1")
    with Client(svc.url, key) as client:
        client.compare(untrained.front, untrained.back, **CHEAP)
    with Client(svc.url, key, retries=3, max_retry_after=0.5) as client:
        waits: list[float] = []
        client.http.sleep = waits.append
        with pytest.raises(RateLimited) as info:
            client.compare(untrained.front, untrained.back, **CHEAP)
    assert waits == []  # Retry-After 1 > max_retry_after 0.5: the caller's to decide
    assert (info.value.status_code, info.value.code) == (429, "too_many_jobs")
    assert "limit for your key is 1" in info.value.message
    assert exit_code_for(info.value) == 3  # not the user's fault: retry later

    from stitchsim.cli import main

    code = main(["compare", str(untrained.front), str(untrained.back), "--url", svc.url,
                 "--api-key", key, "--retries", "0", "--layers", "layer1"])
    err = capsys.readouterr().err
    assert code == 3, err
    assert "(too_many_jobs)" in err
    assert len(_jobs(svc, key)) == 1


def test_a_resubmission_with_the_same_idempotency_key_is_the_same_job(
    gateway_service: ServiceHandle, untrained: Any
) -> None:
    svc = gateway_service
    key = _key_with_limits(svc, "rerun")
    # A CI job that died after submitting is run again with the same key: no second job.
    with Client(svc.url, key) as client:
        first = client.compare(untrained.front, untrained.back, idempotency_key="ci-run-7",
                               **CHEAP)
    with Client(svc.url, key) as client:
        again = client.compare(untrained.front, untrained.back, idempotency_key="ci-run-7",
                               **CHEAP)
        with pytest.raises(Conflict) as info:
            client.compare(untrained.front, untrained.back, idempotency_key="ci-run-7",
                           threshold=0.5, **CHEAP)
    assert again.id == first.id
    assert [j["id"] for j in _jobs(svc, key)] == [first.id]
    assert info.value.code == "idempotency_conflict"
    assert exit_code_for(info.value) == 2  # the user reused a key for another request


def test_with_no_worker_running_a_check_times_out_exits_4_and_cancels(
    gateway_service: ServiceHandle, untrained: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # The gateway alone is a service whose workers are stopped: the job stays queued.
    from stitchsim.cli import main

    svc = gateway_service
    key = svc.create_key("no-worker")
    code = main(["check", str(untrained.front), str(untrained.back), "--url", svc.url,
                 "--api-key", key, "--threshold", "0.5", "--layers", "layer1",
                 "--objectives", "dm", "--timeout", "2", "--progress", "none"])
    err = capsys.readouterr().err
    assert code == 4, err
    job_id = err.split("stitchsim jobs wait ")[1].split("`")[0]
    assert f"job {job_id} still queued after 2s" in err
    # Not left behind in the queue: cancelled at once (it was queued).
    assert [(j["id"], j["state"]) for j in _jobs(svc, key)] == [(job_id, "cancelled")]


# ---------------------------------------------------------------- a gateway that goes away


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceHandle]:
    """Redis mode, so the gateway can die while the workers go on; spec checks off (the
    checks worker would import torch for nothing here). The gpu worker's pool process stays
    and loads the engine at start, while the first test waits out its outage, so the job of
    the second does not wait for torch's import."""
    factory = ServiceFactory(tmp_path_factory)
    svc = factory.redis(extra_env={"STITCHSIM_CHECK_TIMEOUT_S": "0"}, workers=False)
    svc.start_worker("gpu", {"STITCHSIM_WORKER_IDLE_RELEASE_S": "0"})  # 0: engine at start
    svc.start_worker("checks")
    svc.with_workers = True
    svc.wait_ready()
    yield svc
    factory.close()


def _restart_gateway(svc: ServiceHandle) -> None:
    svc.start_gateway()
    svc.wait_ready()


def test_a_submission_backs_off_while_the_gateway_is_down(faulty: ServiceHandle,
                                                          untrained: Any) -> None:
    with Client(faulty.url, faulty.api_key) as client:
        spec = {**CHEAP, "front": {"checkpoint": client.upload_checkpoint(untrained.front).id},
                "back": {"checkpoint": client.upload_checkpoint(untrained.back).id}}
    faulty.stop_process("gateway", signal.SIGKILL)
    with Client(faulty.url, faulty.api_key, retries=5, backoff=0.5) as client:
        waits: list[float] = []

        def sleep(seconds: float) -> None:
            waits.append(seconds)
            if len(waits) == 2:  # refused twice: the gateway comes back on the same port
                _restart_gateway(faulty)
            time.sleep(seconds)

        client.http.sleep = sleep
        job = client.submit(spec)
        job.cancel()
    # Exponential backoff with jitter in [0.5, 1] of 0.5 s, then 1 s.
    assert len(waits) == 2
    assert 0.25 <= waits[0] <= 0.5 and 0.5 <= waits[1] <= 1.0
    assert job.id in [j["id"] for j in _jobs(faulty, faulty.api_key)]


def test_check_rides_out_a_gateway_restart_and_says_no_verdict(
    faulty: ServiceHandle, untrained: Any
) -> None:
    # Random-init models predict at chance: the report withholds its verdict, and the check
    # exits 2 (the user's side: dataset, arch kwargs or preprocessing) with NO VERDICT.
    before = {j["id"] for j in _jobs(faulty, faulty.api_key)}
    env = {k: v for k, v in os.environ.items() if not k.startswith("STITCHSIM_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "stitchsim.cli", "check", str(untrained.front),
         str(untrained.back), "--url", faulty.url, "--api-key", str(faulty.api_key),
         "--threshold", "0.5", "--dataset", "digits", "--layers", "layer1",
         "--objectives", "dm", "--protocols", "standard", "--directions", "front_to_back",
         "--set", "train.max_train_samples=100", "--set", "train.max_test_samples=100",
         "--progress", "lines", "--timeout", "300", "--retries", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    err_lines: list[str] = []
    submitted = threading.Event()

    def read_err() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            err_lines.append(line)
            if line.startswith("stitchsim: job "):
                submitted.set()

    reader = threading.Thread(target=read_err, daemon=True)
    reader.start()
    try:
        assert submitted.wait(120), "".join(err_lines)
        faulty.stop_process("gateway", signal.SIGKILL)  # while the check waits for its job
        killed_at = len(err_lines)
        deadline = time.monotonic() + 60
        while not any("retrying in" in line for line in err_lines[killed_at:]):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(err_lines)
            time.sleep(0.2)
        _restart_gateway(faulty)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    err = "".join(err_lines)
    assert proc.returncode == 2, err + out
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("NO VERDICT: the ") and "scores at chance on this dataset" in last
    assert "PASS" not in out and "FAIL" not in out
    # It waited through the outage on the same job: one job, finished.
    new = [j for j in _jobs(faulty, faulty.api_key) if j["id"] not in before]
    assert [j["state"] for j in new] == ["succeeded"], new
    assert f"stitchsim: job {new[0]['id'][:8]}" in err

