"""The `ci` budget's price of a resnet50 job at 224 px, next to the full default's, at the
GPU-class stand-in (STITCHSIM_CALIBRATION=32:0.002,224:0.0002) and at the 2-core CPU's flat
figure: the spec check's own estimate (expected units x seconds a unit), not a run.

    python bench/ci_budget_estimate.py --out /tmp/ci-estimate

No GPU has run it: the stand-in is an assumption (docs/deploy.md, "Job budgets that follow the
device"); on a GPU host run `stitchsim-server calibrate` and compare.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import timm
from safetensors.torch import save_file
from stitchsim.models import Spec
from stitchsim_worker.calibration import parse_stand_in
from stitchsim_worker.engine import Resources, check_spec

GPU_STAND_IN = "32:0.002,224:0.0002"
CPU_SECONDS_PER_UNIT = 0.04
LIMIT = 200_000_000  # high enough that the check prices the job instead of refusing it


def resnet50(out: Path) -> Path:
    path = out / "resnet50.safetensors"
    if not path.exists():
        net = timm.create_model("resnet50", pretrained=False, num_classes=10)
        save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(path),
                  metadata={"arch": "resnet50", "arch_kwargs": json.dumps({"num_classes": 10})})
    return path


def price(path: Path, budget: str, out: Path) -> dict[str, float]:
    ref = {"checkpoint": {"path": str(path)}, "input_size": 224}
    spec = Spec.model_validate({"front": ref, "back": ref, "budget": budget})
    checked = check_spec(spec, resources=Resources(
        cache_dir=out, calibration=parse_stand_in(GPU_STAND_IN), max_job_units=LIMIT))
    return {"units": checked.units, "expected_units": checked.expected_units,
            "gpu_stand_in_s": checked.expected_units * checked.seconds_per_unit,
            "cpu_s": checked.expected_units * CPU_SECONDS_PER_UNIT}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    path = resnet50(args.out)
    rows = {budget: price(path, budget, args.out) for budget in ("full", "ci")}
    for budget, r in rows.items():
        print(f"{budget:>4}: {r['expected_units']:>12,.0f} expected units; "
              f"{r['gpu_stand_in_s']:8.0f} s at the GPU stand-in, {r['cpu_s']:10,.0f} s on 2 CPU "
              "cores")
    print(f"ci / full: {rows['ci']['expected_units'] / rows['full']['expected_units']:.3f}")


if __name__ == "__main__":
    main()
