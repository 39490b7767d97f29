"""Submits a tiny real job to a running service and waits for its report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

JOB_TIMEOUT_S = 240.0


def _one_layer(path: Path) -> str | None:
    """A stage output in the middle of the network, as the engine names it."""
    from safetensors import safe_open
    from stitchsim_worker.engine import list_stitch_points

    with safe_open(str(path), framework="np") as handle:
        meta = handle.metadata() or {}
    if "arch" not in meta:
        return None
    points = list_stitch_points(meta["arch"], json.loads(meta.get("arch_kwargs") or "{}"))
    stages = points.get("stages") or points.get("all") or []
    return stages[len(stages) // 2] if stages else None


def _upload(http: httpx.Client, path: Path) -> str:
    with path.open("rb") as handle:
        response = http.post("/checkpoints", files={"file": (path.name, handle)})
    response.raise_for_status()
    return str(response.json()["id"])


def tiny_spec(front: str, back: str, layer: str | None) -> dict[str, Any]:
    return {
        "front": {"checkpoint": front},
        "back": {"checkpoint": back},
        "dataset": "digits",
        "layers": [{"front": layer, "back": layer}] if layer else "auto",
        "objectives": ["slm"],
        "protocols": ["standard", "invariance_aware"],
        "directions": "both",
        "train": {"epochs": 1, "max_train_samples": 200, "max_test_samples": 100},
        # The page tests read the IRI figures, never their convergence: no extra rounds.
        # Ten steps leave the IRIs unconverged; the page is under test, so its verdict is
        # accepted explicitly (issue 36 withholds it otherwise).
        "iri": {"method": "fast", "steps": 10, "extra_rounds": 0, "accept_unconverged": True},
        "controls": ["identity", "clustered_noise"],
        "threshold": 0.5,
    }


def run_tiny_job(service: Any, ckpts: Any) -> tuple[str, dict[str, Any]]:
    """(job id, JSON report) of a finished job on `service` (a tests.fixtures_service
    ServiceHandle) comparing two small trained checkpoints."""
    # Two models of one architecture from different seeds: one layer name fits both.
    front_path, back_path = Path(ckpts.digits_resnet), Path(ckpts.digits_resnet_b)
    with service.client() as http:
        front, back = (_upload(http, path) for path in (front_path, back_path))
        created = http.post("/similarity", json=tiny_spec(front, back, _one_layer(front_path)))
        assert created.status_code == 202, created.text
        job_id = created.json()["job_id"]
        final = service.wait_job(job_id, timeout=JOB_TIMEOUT_S)[-1]
        assert final["state"] == "succeeded", json.dumps(final, indent=2)
        report = http.get(f"/jobs/{job_id}/report")
        report.raise_for_status()
        return job_id, report.json()
