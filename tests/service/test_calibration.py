"""Budgets that follow the worker's device, through a real service: a job worker announces
its device calibration (here a GPU-class stand-in, STITCHSIM_CALIBRATION) in the workers
table, the check worker prices a default resnet50 job at 224 px with it and accepts it under
the default unit limit; once a CPU-class job worker serves the queue too, the slowest worker
prices the job and the submission is refused with 422 job_too_large, the calibrated estimate
in its message, and no job made."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from stitchsim.models import Spec

from tests.engine.test_calibration import CPU_CLASS, GPU_CLASS, resnet50  # noqa: F401
from tests.fixtures_service import ServiceFactory, ServiceHandle, cli_command
from tests.service.conftest import upload
from tests.service.helpers import assert_error_body


def _calibrations(svc: ServiceHandle) -> dict[str, Any]:
    from sqlalchemy import create_engine, text

    engine = create_engine(svc._sqlalchemy_url())
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT name, queues, calibration FROM workers")).all()
    finally:
        engine.dispose()
    return {name: json.loads(cal) for name, queues, cal in rows
            if cal and "gpu" in queues.split(",")}


def _wait_for(svc: ServiceHandle, n: int, timeout: float = 240) -> dict[str, Any]:
    """Until n job workers announced a calibration (each measures in a child process that
    imports torch first: seconds on a busy machine)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _calibrations(svc)
        if len(found) >= n:
            return found
        time.sleep(0.5)
    raise AssertionError(f"{n} calibrations not announced in {timeout} s:\n{svc.logs()}")


def test_a_resnet50_at_224_px_is_accepted_on_a_gpu_worker_refused_on_a_cpu_one(
        service_factory: ServiceFactory, resnet50: Path) -> None:  # noqa: F811
    from stitchsim_service.core.queue import JobQueue
    from stitchsim_service.core.settings import Settings

    svc = service_factory.embedded(extra_env={
        "STITCHSIM_CALIBRATION": GPU_CLASS,
        "STITCHSIM_MAX_UPLOAD_BYTES": str(256 * 1024 * 1024)})
    (gpu,) = _wait_for(svc, 1).values()
    assert gpu["seconds_per_unit"] == {"32": 0.002, "224": 0.0002}, gpu
    with svc.client() as c:
        cid = upload(c, resnet50)
    ref = {"checkpoint": cid, "input_size": 224}
    spec = {"front": ref, "back": ref}

    # Accepted: the check worker's answer, asked as submission asks it (a job queued here
    # would run a resnet50 on this machine's CPU).
    doc = Spec.model_validate(spec).model_dump(mode="json")
    outcome = JobQueue(Settings(data_dir=svc.data_dir)).check_spec(doc, 150)
    assert outcome.checked and outcome.failure is None, outcome
    est = outcome.estimate
    # 3.2 M under the paper's IRIs (10.7 M under fast's 700-step cap): over the 1 M default
    assert est is not None and est.units > 3_000_000, est
    # the expected units at the GPU's rate (seconds rounded to 0.1): under the 4 h time limit
    assert est.seconds is not None and 0 < est.seconds <= est.units * 0.0002 + 0.05
    assert est.seconds < 4 * 3600

    # A CPU-class job worker joins the queue: a job may land on it, so it prices the job.
    svc._spawn("worker_cpu", cli_command("worker", "--queues", "gpu", "--name", "cpu@test"),
               {**svc.env, "STITCHSIM_CALIBRATION": CPU_CLASS})
    found = _wait_for(svc, 2)
    assert sorted(c["seconds_per_unit"]["224"] for c in found.values()) == [0.0002, 0.04]
    with svc.client() as c:
        r = c.post("/similarity", json=spec)
    assert r.status_code == 422, r.text
    err = assert_error_body(r)
    assert err["code"] == "job_too_large", err
    d = err["details"]
    assert d["units"] == est.units and d["limit"] == 1_000_000 and d["seconds_per_unit"] == 0.04
    assert d["estimate"]["seconds"] > 4 * 3600 and d["input_size"] == 224, d
    assert "0.04 s a unit at 224 px" in err["message"], err["message"]
    assert f"about {d['estimate']['seconds']:,.0f} s of worker time, at 0.04 s a unit" \
        in err["message"], err["message"]
    assert svc.count_rows("jobs") == 0
