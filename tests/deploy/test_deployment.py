"""The deployment of docker-compose.yml, run as local processes (see conftest.py): the S3 store
for real, PostgreSQL as the job table, two gpu workers sharing one queue, and the compose file's
health-check commands run against the live processes."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
from stitchsim.models import Report

from tests.deploy import compose_rules
from tests.deploy.live import (
    CHECKS_NODE,
    GPU_NODES,
    Deployment,
    sha256_hex,
    spawn,
    with_venv_path,
)
from tests.fixtures_models import Checkpoints
from tests.fixtures_service import cli_command, free_port

# Tiny: a few seconds of work per job on one CPU thread.
SPEC: dict[str, Any] = {
    "dataset": "digits",
    "layers": [{"front": "layer1", "back": "layer1"}],
    "objectives": ["slm"],
    "protocols": ["standard"],
    "directions": "front_to_back",
    "train": {"epochs": 1, "max_train_samples": 200, "max_test_samples": 100},
}


def _upload(c: Any, path: Path) -> str:
    with open(path, "rb") as fh:
        r = c.post("/checkpoints", files={"file": (path.name, fh)})
    assert r.status_code in (200, 201), r.text
    return str(r.json()["id"])


def _submit(c: Any, front: str, back: str, seed: int = 0) -> str:
    spec = {**SPEC, "front": {"checkpoint": front}, "back": {"checkpoint": back},
            "train": {**SPEC["train"], "seed": seed}}
    r = c.post("/similarity", json=spec)
    assert r.status_code == 202, r.text
    return str(r.json()["job_id"])


def _figures(report: dict[str, Any]) -> Any:
    """The report without timings and ids: what must match between workers."""
    def strip(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in ("seconds", "stage_seconds")}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    return strip({k: report[k] for k in ("results", "controls", "summary", "front", "back")})


def test_job_through_the_s3_store(deployment: Deployment, ckpts: Checkpoints) -> None:
    d = deployment
    with d.svc.client() as c:
        front, back = _upload(c, ckpts.digits_resnet), _upload(c, ckpts.digits_resnet_b)
        job = _submit(c, front, back)
        states = [s["state"] for s in d.svc.wait_job(job, timeout=120)]
        assert states[-1] == "succeeded", d.svc.logs()
        report = c.get(f"/jobs/{job}/report").json()
    Report.model_validate(report)
    assert len(report["results"]) == 1
    row = report["results"][0]
    assert (row["front_layer"], row["objective"], row["protocol"]) == ("layer1", "slm",
                                                                       "standard")
    assert 0.0 <= row["agreement"] <= 1.0 and report["back"]["accuracy"] > 0.5

    # The objects are in the bucket, content-addressed, byte for byte; the report the gateway
    # served is the one a worker wrote there.
    objects = d.objects()
    for oid, path in ((front, ckpts.digits_resnet), (back, ckpts.digits_resnet_b)):
        hexd = oid.removeprefix("sha256:")
        key = f"checkpoints/{hexd[:2]}/{hexd}.safetensors"
        assert objects[key] == path.read_bytes() and sha256_hex(objects[key]) == hexd
    assert json.loads(objects[f"reports/{job}.json"]) == report
    # Beside them, the reference's work kept for the next check against it, in the bucket every
    # worker shares (worker/engine/core/refcache.py): manifests and their blobs, nothing else.
    kept = {k for k in objects if k.startswith("refcache/v1/")}
    assert any("/blobs/" in k for k in kept) and any(k.endswith(".json") for k in kept), kept
    assert set(objects) - kept == {f"checkpoints/{o.removeprefix('sha256:')[:2]}/"
                                   f"{o.removeprefix('sha256:')}.safetensors" for o in (front, back)
                                   } | {f"reports/{job}.json"}

    # Nothing went to a local store: the worker that ran it downloaded both checkpoints from
    # S3 into its own cache (verified by hash there), the gateway kept none.
    ran_on = d.job_rows([job])[job]["worker"]
    assert ran_on in GPU_NODES
    cached = sorted(p.name for p in (d.hosts[ran_on] / "cache" / "objects").rglob("*")
                    if p.is_file())
    assert cached == sorted(f"{o.removeprefix('sha256:')}.safetensors" for o in {front, back})
    for host in d.hosts.values():
        assert not (host / "store").exists()


def _second_gateway(d: Deployment) -> str:
    """Another gateway on the same Redis, job table and bucket, without the spec check: six
    submissions then take milliseconds, so all six are queued before the first job ends and
    the spread over the workers does not hang on timing (a worker holds one unacknowledged
    job at a time, so while one runs the next must go to the other)."""
    port = free_port()
    env = {**d.svc.env, "STITCHSIM_PORT": str(port), "STITCHSIM_CHECK_TIMEOUT_S": "0"}
    spawn(d.svc, "gateway2", cli_command("gateway"), env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(url + "/healthz", timeout=2).raise_for_status()
            return url
        except httpx.HTTPError:
            assert time.monotonic() < deadline, d.svc.logs()
            time.sleep(0.2)


def test_two_workers_share_the_gpu_queue(deployment: Deployment, ckpts: Checkpoints) -> None:
    d = deployment
    seeds = [0, 1, 2, 0, 1, 2]
    with d.svc.client() as c:
        front, back = _upload(c, ckpts.digits_resnet), _upload(c, ckpts.digits_resnet_b)
    with httpx.Client(base_url=_second_gateway(d), timeout=120,
                      headers={"Authorization": f"Bearer {d.svc.api_key}"}) as c2:
        jobs = [_submit(c2, front, back, seed) for seed in seeds]
    with d.svc.client() as c:  # the first gateway sees them too: one table, one store
        finals = [d.svc.wait_job(j, timeout=180)[-1] for j in jobs]
        reports = [c.get(f"/jobs/{j}/report").json() for j in jobs]
    assert [f["state"] for f in finals] == ["succeeded"] * 6, d.svc.logs()

    # The job table (PostgreSQL) says who ran what: both workers ran some, each job once.
    rows = d.job_rows(jobs)
    assert d.svc.database_url.startswith("postgresql://") and len(rows) == 6
    ran_on = [rows[j]["worker"] for j in jobs]
    assert set(ran_on) == set(GPU_NODES), ran_on
    assert [rows[j]["attempts"] for j in jobs] == [1] * 6
    # In parallel, not in turns: some job on one worker ran while a job on the other did.
    spans = {node: [(rows[j]["started_at"], rows[j]["finished_at"]) for j in jobs
                    if rows[j]["worker"] == node] for node in GPU_NODES}
    a, b = spans.values()
    assert any(s1 < e2 and s2 < e1 for s1, e1 in a for s2, e2 in b), spans
    # And the workers' own logs agree: one attempt line per job, from the worker the table names.
    logs = d.worker_logs()
    for j, node in zip(jobs, ran_on, strict=True):
        lines = [ln for ln in logs.splitlines() if f"job {j}: attempt" in ln]
        assert len(lines) == 1 and lines[0].endswith(f"attempt 1 on {node}"), lines
    assert "dropping this delivery" not in logs and "superseded" not in logs

    # Same seed, same figures, whichever worker ran it (deterministic on one device type).
    for i in range(3):
        assert _figures(reports[i]) == _figures(reports[i + 3])
    assert _figures(reports[0]) != _figures(reports[1])


def _healthcheck(service: str) -> str:
    test = compose_rules.load()["services"][service]["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL"
    return compose_rules.interpolate(test[1])  # $$HOSTNAME -> $HOSTNAME, as Compose passes it


def _run_check(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", command], env=with_venv_path(env), capture_output=True,
                          text=True, timeout=60)


def test_compose_health_checks_against_live_processes(deployment: Deployment) -> None:
    """The compose file's health checks, verbatim, answered by the running processes; a worker
    that is not there fails its check."""
    d = deployment
    gpu_check, checks_check = _healthcheck("worker-gpu"), _healthcheck("worker-checks")
    for node in GPU_NODES:
        out = _run_check(gpu_check, {**d.env[node], "HOSTNAME": node.split("@")[1]})
        assert out.returncode == 0, out.stdout + out.stderr
    out = _run_check(checks_check, {**d.env[CHECKS_NODE], "HOSTNAME": CHECKS_NODE.split("@")[1]})
    assert out.returncode == 0, out.stdout + out.stderr
    # No gpu worker on host deploy-c: that check must fail (a short wait suffices to tell).
    gone = _run_check(gpu_check.replace("-t 10", "-t 2"),
                      {**d.env[CHECKS_NODE], "HOSTNAME": "deploy-c"})
    assert gone.returncode != 0
    out = _run_check(_healthcheck("gateway"), d.svc.env)
    assert out.returncode == 0, out.stdout + out.stderr
