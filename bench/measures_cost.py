"""What the similarity measures add to a job that already runs the invariance-aware protocol
at the same stitch points (issue 14: at most 10 %).

The same job runs twice, each with a cold IRI cache: without measures, then with
`measures: ["cka", "mutual_knn"]` (their ceiling and floor included). Printed: both wall
times, the measures' own stage time, and the ratios. With --iri-split test it also prices the
paper's variant (IRIs of the test split, an extra IRI synthesis).

    python bench/measures_cost.py [--arch test_resnet] [--train 400] [--test 300]
                                  [--iri-steps 50] [--epochs 5] [--device cpu]

The defaults are a small CPU job (the engine tests' settings); the service's defaults (the
full digits set, 200 IRI steps, 10 epochs) make the base job heavier and the ratio smaller.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from stitchsim.models import Report, Spec
from stitchsim_worker.engine import Resources, run_job
from stitchsim_worker.engine.models.zoo import make_checkpoint


def _spec(front: Path, back: Path, args: argparse.Namespace, **extra: Any) -> Spec:
    return Spec.model_validate({
        "front": {"checkpoint": {"path": str(front)}},
        "back": {"checkpoint": {"path": str(back)}},
        "dataset": "digits",
        "objectives": ["slm"],
        "protocols": ["standard", "invariance_aware"],
        "directions": "both",
        "train": {"epochs": args.epochs, "max_train_samples": args.train,
                  "max_test_samples": args.test},
        "iri": {"steps": args.iri_steps, "step_size": 4 / 255},
        "device": args.device,
        **extra,
    })


def _timed(spec: Spec, cache: Path) -> tuple[float, Report]:
    t0 = time.perf_counter()
    report = run_job(spec, resources=Resources(cache_dir=cache))
    return time.perf_counter() - t0, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="test_resnet")
    parser.add_argument("--train", type=int, default=400)
    parser.add_argument("--test", type=int, default=300)
    parser.add_argument("--iri-steps", type=int, default=50)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--iri-split", choices=["train", "test"], default="train")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        front, back = root / "a.safetensors", root / "b.safetensors"
        for path, seed in ((front, 0), (back, 1)):
            make_checkpoint(path, args.arch, "digits", seed=seed, epochs=3, lr=0.01)
        base_s, base = _timed(_spec(front, back, args), root / "cache-base")
        print(f"job without measures: {base_s:8.1f} s", flush=True)
        spec = _spec(front, back, args, measures=["cka", "mutual_knn"],
                     measure_settings={"iri_split": args.iri_split})
        with_s, measured = _timed(spec, root / "cache-measures")
    stage = measured.environment["stage_seconds"].get("measures", 0.0)
    points = len(base.front.layers)
    print(f"{args.arch} on digits ({args.train} train / {args.test} test samples), "
          f"{points} stitch points, both directions, slm, standard + invariance_aware, "
          f"{args.iri_steps} IRI steps, device {args.device}, IRIs for the measures: "
          f"{args.iri_split} split")
    print(f"job with measures:    {with_s:8.1f} s  ({len(measured.measures)} measure rows, "
          f"{len(measured.measure_controls)} control rows)")
    print(f"measures stage:       {stage:8.1f} s")
    print(f"ratio (with - without) / without: {(with_s - base_s) / base_s:+.1%}")
    print(f"ratio measures stage / without:   {stage / base_s:.1%}  (target <= 10%)")
    for m in measured.summary.measures:
        print(f"  {m.direction:14s} {m.measure:10s} real {m.real:.3f}  iri {m.iri:.3f}  "
              f"gap {m.gap:+.3f}")


if __name__ == "__main__":
    main()
