"""How close the running ETA comes to the truth: jobs run in-process (no HTTP, no Celery) with
the engine's own ETA (the one the worker publishes) from its progress calls; at each
checkpoint of progress (10 %, 25 %, 50 %, 75 %) the ETA shown is compared with the time the job
then really took to finish.

    python bench/eta_accuracy.py [--jobs tiny,standard,iri,controls,adversarial,measures,demo]
                                 [--arch test_resnet]

Prints one line per job and checkpoint: ETA, true remaining seconds, their ratio (1.0 is
exact; the promise is within 0.5-2), and the job's work units (the per-job budget's count);
then per job the seconds a unit took (what STITCHSIM_SECONDS_PER_UNIT should be on this
machine), the spec check's estimate against the time taken, the longest stretch the progress
bar stood still and whether it reached 100 % before the end. `demo` is
examples/demo-spec.json on the demo's reference and retrained models (`stitchsim-server
demo-models`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stitchsim.models import Spec  # noqa: E402
from stitchsim_service.core.settings import Settings  # noqa: E402
from stitchsim_worker.engine import Resources, check_spec, run_job  # noqa: E402
from stitchsim_worker.engine.models.zoo import make_checkpoint  # noqa: E402
from stitchsim_worker.run_command import train_demo_models  # noqa: E402

from tests.service.helpers import TINY_SPEC  # noqa: E402

MARKS = (0.10, 0.25, 0.50, 0.75)
ROOT = Path(__file__).resolve().parents[1]

JOBS: dict[str, dict[str, Any]] = {
    "tiny": TINY_SPEC,
    "standard": {**TINY_SPEC, "layers": "auto", "train": {"epochs": 3, "seed": 0,
                                                          "max_train_samples": 600}},
    "iri": {**TINY_SPEC, "protocols": ["standard", "invariance_aware"],
            "train": {"epochs": 2, "max_train_samples": 300, "seed": 0}, "iri": {"steps": 40}},
    "controls": {**TINY_SPEC, "controls": ["clustered_noise", "identity"],
                 "train": {"epochs": 3, "max_train_samples": 400, "seed": 0}},
    "adversarial": {**TINY_SPEC, "protocols": ["standard", "adversarial"],
                    "adversarial": {"evaluate": True, "steps": 3},
                    "train": {"epochs": 2, "max_train_samples": 300, "seed": 0}},
    "measures": {**TINY_SPEC, "measures": ["cka", "mutual_knn"], "layers": "auto",
                 "train": {"epochs": 2, "max_train_samples": 300, "seed": 0}},
    "demo": json.loads((ROOT / "examples" / "demo-spec.json").read_text()),
}


class Stats:
    def __init__(self) -> None:
        self.units = 0
        self.stall_s = 0.0  # longest time without progress, while the job ran
        self.full_at: float | None = None  # when done reached total before the end
        self.seconds = 0.0
        self.by_stage: dict[str, list[float]] = {}  # stage kind -> [seconds, units]
        self.unit_seconds: dict[str, float] = {}  # the engine's seconds a unit, by kind


def measure(spec: Spec, cache: Path) -> tuple[list[tuple[float, float, float]], Stats]:
    """(fraction, eta shown, seconds elapsed) at each mark, and the job's figures."""
    t0 = time.monotonic()
    planned: list[float] = []  # when the plan was made, as the worker's tracker takes it
    seen: list[tuple[float, float, float]] = []
    st = Stats()
    last = [0, t0]  # done, when it last moved
    prev: list[Any] = ["", 0, t0]  # stage, done, when: the figures the next call charges to
    def progress(stage: str, done: int, total: int, eta: float | None) -> None:
        now = time.monotonic()
        kind = prev[0].split(" ")[0]
        acc = st.by_stage.setdefault(kind, [0.0, 0.0])
        acc[0] += now - prev[2]
        acc[1] += done - prev[1]
        prev[:] = [stage, done, now]
        st.units = total
        if not total:
            return
        if not planned:
            planned.append(now)
        if done != last[0]:
            st.stall_s = max(st.stall_s, now - last[1])
            last[:] = [done, now]
        if done >= total and st.full_at is None:
            st.full_at = now - t0
        frac = done / total
        while len(seen) < len(MARKS) and MARKS[len(seen)] <= frac < 1.0:
            seen.append((frac, eta if eta is not None else float("nan"), now - t0))

    report = run_job(spec, resources=Resources(cache_dir=cache), progress=progress)
    st.unit_seconds = report.environment["unit_seconds"]
    end = time.monotonic() - t0
    st.stall_s = max(st.stall_s, time.monotonic() - last[1])
    st.seconds = end - (planned[0] - t0 if planned else 0.0)
    if st.full_at is not None:
        st.full_at = end - st.full_at  # seconds at 100 % before the job ended
    return [(f, eta, end - at) for f, eta, at in seen], st


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
            front = back = ref
            if name == "demo":
                files = ("reference.safetensors", "retrained.safetensors")
                train_demo_models(root, files)
                front, back = ({"checkpoint": {"path": str(root / f)}} for f in files)
            spec = Spec.model_validate({**JOBS[name], "front": front, "back": back})
            checked = check_spec(spec, resources=Resources(cache_dir=root))
            points, st = measure(spec, root / f"cache-{name}")
            for frac, eta, truth in points:
                if eta != eta:  # None: the job has not timed any work past its warm-up yet
                    print(f"{name:9s} {args.arch} at {frac:4.0%}: no ETA shown yet, true "
                          f"{truth:6.1f} s  ({st.units} units)", flush=True)
                    continue
                ratio = eta / truth if truth > 0 else float("nan")
                worst = max(worst, ratio, 1 / ratio if ratio > 0 else float("inf"))
                print(f"{name:9s} {args.arch} at {frac:4.0%}: eta {eta:6.1f} s, true "
                      f"{truth:6.1f} s, ratio {ratio:4.2f}  ({st.units} units)", flush=True)
            full = "never before the end" if st.full_at is None else f"{st.full_at:.1f} s early"
            print(f"{name:9s} {st.seconds:.1f} s for {st.units} units: "
                  f"{st.seconds / max(st.units, 1):.4f} s a unit; longest stall "
                  f"{st.stall_s:.1f} s; at 100 % {full}", flush=True)
            spu = Settings().seconds_per_unit
            print(f"{name:9s} estimate at submission: {checked.units} units (IRIs at their cap), "
                  f"{checked.expected_units} expected, {checked.expected_units * spu:.1f} s at "
                  f"{spu:g} s a unit; took {st.seconds:.1f} s, ratio "
                  f"{checked.expected_units * spu / st.seconds:.2f}", flush=True)
            print(f"{name:9s} by kind of unit: " + ", ".join(
                f"{k} {v:.4f} s" for k, v in st.unit_seconds.items()), flush=True)
            print(f"{name:9s} by stage: " + ", ".join(
                f"{k} {sec:.1f} s / {u:.0f} units = {sec / u:.4f}" if u else f"{k} {sec:.1f} s"
                for k, (sec, u) in st.by_stage.items() if k and sec > 0.05), flush=True)
        print(f"worst factor between ETA and truth: {worst:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
