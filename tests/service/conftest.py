"""Shared by the service tests: the in-process reference report of the tiny spec."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from stitchsim.models import Report, Spec

from tests.service.helpers import TINY_SPEC


def tiny_spec(front: Any, back: Any, **over: Any) -> dict[str, Any]:
    spec = json.loads(json.dumps(TINY_SPEC))
    spec.update(over)
    spec["front"] = front
    spec["back"] = back
    return spec


@pytest.fixture(scope="session")
def reference_report(ckpts: Any, tmp_path_factory: pytest.TempPathFactory) -> Report:
    """The tiny spec run in this process, no HTTP, no Celery: what every mode must match."""
    from stitchsim_worker.engine import Resources, run_job

    spec = Spec.model_validate(tiny_spec({"checkpoint": {"path": str(ckpts.digits_resnet)}},
                                         {"checkpoint": {"path": str(ckpts.digits_resnet_b)}}))
    return run_job(spec, resources=Resources(cache_dir=tmp_path_factory.mktemp("ref-cache")))


_TIMING = {"seconds", "stage_seconds"}


def figures(report: Report | dict[str, Any]) -> dict[str, Any]:
    """Every figure of a report, without wall-clock timings and ids."""
    data = report.model_dump(mode="json") if isinstance(report, Report) else report

    def strip(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in _TIMING}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    return {"results": strip(data["results"]), "controls": strip(data["controls"]),
            "summary": strip(data["summary"]), "verdict": data["verdict"],
            "front_accuracy": data["front"]["accuracy"], "back_accuracy": data["back"]["accuracy"]}


def unflagged_figures(report: Report | dict[str, Any]) -> dict[str, Any]:
    """The figures, without the flag that says where the IRIs came from (a cache hit or not)."""
    got = figures(report)
    for row in got["results"]:
        if row.get("iri"):
            row["iri"]["cache_hit"] = None
    return got


def assert_same_figures(got: dict[str, Any], want: dict[str, Any], tol: float = 1e-6) -> None:
    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(b, float) and isinstance(a, (int, float)):
            assert math.isclose(a, b, rel_tol=tol, abs_tol=tol), f"{path}: {a} != {b}"
        elif isinstance(b, dict):
            assert isinstance(a, dict) and set(a) == set(b), f"{path}: keys differ"
            for k in b:
                walk(a[k], b[k], f"{path}.{k}")
        elif isinstance(b, list):
            assert isinstance(a, list) and len(a) == len(b), f"{path}: lengths differ"
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                walk(x, y, f"{path}[{i}]")
        else:
            assert a == b, f"{path}: {a!r} != {b!r}"

    walk(got, want, "report")


def upload(client: Any, path: Path, endpoint: str = "/checkpoints") -> str:
    with open(path, "rb") as fh:
        r = client.post(endpoint, files={"file": (path.name, fh)})
    assert r.status_code in (200, 201), r.text
    return str(r.json()["id"])


def submit(svc: Any, spec: dict[str, Any]) -> str:
    """POST /similarity with a JSON spec; the new job's id."""
    with svc.client() as c:
        r = c.post("/similarity", json=spec)
    assert r.status_code == 202, r.text
    return str(r.json()["job_id"])


def job_report(svc: Any, job_id: str) -> dict[str, Any]:
    """The JSON report of a finished job."""
    with svc.client() as c:
        r = c.get(f"/jobs/{job_id}/report")
    assert r.status_code == 200, r.text
    return dict(r.json())
