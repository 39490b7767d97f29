"""Running small jobs in-process for the engine tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stitchsim.models import Report, ResultRow, Spec
from stitchsim_worker.engine import Resources, run_job

from tests.fixtures_models import REPO, cache_key, cache_root

FAST = {"epochs": 5, "max_train_samples": 400, "max_test_samples": 300}
FAST_IRI = {"method": "fast", "steps": 50, "extra_rounds": 0}  # half a fast round, no extra
# rounds: fast (the figures these tests assert were measured under the fast method)
# IRIs cost a synthesis per training input: invariance-aware tests train on half FAST's inputs.
FAST_IA = {**FAST, "max_train_samples": 200}
# Cache and plumbing tests need IRIs, not good ones.
TINY = {"epochs": 1, "max_train_samples": 64, "max_test_samples": 100}
# The reference cache's tests: one point, both protocols, IRIs of 8 steps and no finishing
# rounds (what is cached matters, not how good it is).
REUSE_SPEC: dict[str, Any] = {
    "dataset": "digits",
    "layers": [{"front": "layer1", "back": "layer1"}],
    "objectives": ["slm"],
    "protocols": ["standard", "invariance_aware"],
    "directions": "front_to_back",
    "train": {"epochs": 1, "max_train_samples": 64, "max_test_samples": 64, "seed": 3},
    "iri": {"steps": 8, "extra_rounds": 0},
}


def spec(front: Path, back: Path, **fields: Any) -> Spec:
    body = {
        "front": {"checkpoint": {"path": str(front)}},
        "back": {"checkpoint": {"path": str(back)}},
    }
    body.setdefault("directions", "front_to_back")
    return Spec.model_validate({**body, "directions": "front_to_back", **fields})


def run(s: Spec, cache: Path, **resources: Any) -> Report:
    return run_job(s, resources=Resources(cache_dir=cache, **resources))


def rows(report: Report, **match: Any) -> list[ResultRow]:
    found = [
        r
        for r in report.results + report.controls
        if all(getattr(r, k) == v for k, v in match.items())
    ]
    assert found, f"no rows match {match}"
    return found


def layers(*names: str) -> list[dict[str, str]]:
    return [{"front": n, "back": n} for n in names]


# The code an IRI's pixels depend on beyond what the engine's own IRI key holds (the front
# model's identity, the point, the inputs' digest, the settings): the synthesis, the model's
# cut and forward, the data, the distances it steps on (measures), the banks, cache and
# context it runs in (core), the spec's defaults.
IRI_CODE = sorted(
    str(f.relative_to(REPO))
    for folder in ("worker/engine/core", "worker/engine/iri", "worker/engine/models",
                   "worker/engine/data", "worker/engine/measures", "worker/engine/stitching",
                   "worker/engine/protocols", "worker/engine/job")
    for f in (REPO / folder).rglob("*.py")
) + ["client/stitchsim/models/spec.py", "client/stitchsim/models/settings.py",
     "client/stitchsim/datasets.py"]


def shared_cache() -> Path:
    """A job cache shared by test processes and runs, keyed by the code above, for tests that
    do not assert cache misses: the engine's IRI cache is content-addressed and written
    whole (renamed into place), so IRIs one test (or run) made are another's hit, as they
    would be for a user. Tests of the cache itself keep their own tmp_path."""
    root = cache_root() / f"jobs-{cache_key({}, IRI_CODE)}"
    root.mkdir(parents=True, exist_ok=True)
    return root
