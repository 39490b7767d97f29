"""How close the running ETA comes to the truth: jobs run in-process (no HTTP, no Celery) with
the worker's own ETA formula (runner.eta_seconds) fed by the engine's progress; at each
checkpoint of progress (10 %, 25 %, 50 %, 75 %) the ETA shown is compared with the time the job
then really took to finish.

    python bench/eta_accuracy.py [--jobs tiny,standard,iri,controls] [--arch test_resnet]

Prints one line per job and checkpoint: ETA, true remaining seconds, their ratio (1.0 is
exact; the promise is within 0.5-2), and the job's work units (the per-job budget's count).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stitchsim.models import Spec  # noqa: E402
from stitchsim_worker.engine import Resources, run_job  # noqa: E402
from stitchsim_worker.engine.zoo import make_checkpoint  # noqa: E402
from stitchsim_worker.runner import eta_seconds  # noqa: E402

from tests.service.helpers import TINY_SPEC  # noqa: E402

MARKS = (0.10, 0.25, 0.50, 0.75)

JOBS: dict[str, dict[str, Any]] = {
    "tiny": TINY_SPEC,
    "standard": {**TINY_SPEC, "layers": "auto", "train": {"epochs": 3, "seed": 0,
                                                          "max_train_samples": 600}},
    "iri": {**TINY_SPEC, "protocols": ["standard", "invariance_aware"],
            "train": {"epochs": 2, "max_train_samples": 300, "seed": 0}, "iri": {"steps": 40}},
    "controls": {**TINY_SPEC, "controls": ["clustered_noise", "identity"],
                 "train": {"epochs": 3, "max_train_samples": 400, "seed": 0}},
}


def measure(spec: Spec, cache: Path) -> tuple[list[tuple[float, float, float]], int]:
    """(fraction, eta shown, seconds elapsed) at each mark, and the job's total units."""
    t0 = time.monotonic()
    planned: list[float] = []  # when the plan was made, as the worker's tracker takes it
    seen: list[tuple[float, float, float]] = []
    total_units = [0]

    def progress(_stage: str, done: int, total: int) -> None:
        total_units[0] = total
        if not total:
            return
        if not planned:
            planned.append(time.monotonic())
        frac = done / total
        while len(seen) < len(MARKS) and MARKS[len(seen)] <= frac < 1.0:
            eta = eta_seconds(time.monotonic() - planned[0], done, total)
            seen.append((frac, eta if eta is not None else float("nan"), time.monotonic() - t0))

    run_job(spec, resources=Resources(cache_dir=cache), progress=progress)
    end = time.monotonic() - t0
    return [(f, eta, end - at) for f, eta, at in seen], total_units[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default=",".join(JOBS))
    parser.add_argument("--arch", default="test_resnet")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ckpt = root / "m.safetensors"
        make_checkpoint(ckpt, args.arch, "digits_digit_only", arch_kwargs={}, seed=0, epochs=2,
                        lr=0.01)
        ref = {"checkpoint": {"path": str(ckpt)}}
        worst = 1.0
        for name in args.jobs.split(","):
            spec = Spec.model_validate({**JOBS[name], "front": ref, "back": ref})
            points, units = measure(spec, root / f"cache-{name}")
            for frac, eta, truth in points:
                ratio = eta / truth if truth > 0 else float("nan")
                worst = max(worst, ratio, 1 / ratio if ratio > 0 else float("inf"))
                print(f"{name:9s} {args.arch} at {frac:4.0%}: eta {eta:6.1f} s, true "
                      f"{truth:6.1f} s, ratio {ratio:4.2f}  ({units} units)", flush=True)
        print(f"worst factor between ETA and truth: {worst:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
