"""IRI synthesis, today's method against the defaults, on the same inputs at every stage point.

For each architecture a small model is trained on a built-in set (cached in --workdir); at each
of its stage points both methods synthesise IRIs of the same training inputs from the same
noise. Printed per point and in total: time per IRI set (wall, and the process's CPU time,
which other loads on a shared machine disturb less), input-steps per second (forward and
backward passes of one input through the front part), steps used per sample, the median and
p90 of the final relative distance, and the time ratios new/old. "old" is today's method as it
ran before this issue: its schedule, no early stopping, and the first releases' kernels
(fast_kernels false); a point where the new IRIs are further than the old ones is marked.

    python bench/iri_convergence.py                        # test_resnet, test_vit, test_convnext
    python bench/iri_convergence.py --archs test_resnet --n 512
    python bench/iri_convergence.py --new stop_below=null   # any IRISettings field, as JSON
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from stitchsim.models import IRISettings, ModelRef
from stitchsim_worker.engine.core.bank import BankBuilder
from stitchsim_worker.engine.core.device import pick_device
from stitchsim_worker.engine.data.datasets import builtin
from stitchsim_worker.engine.iri.synthesis import synthesize
from stitchsim_worker.engine.models.loading import build_model
from stitchsim_worker.engine.models.network import Network
from stitchsim_worker.engine.models.zoo import make_checkpoint

# Today's method (before the cosine defaults): the paper's 200 signed steps of 1/255 (the sign of
# each step's own gradient), every sample stepped to the end, the last iterate kept, the
# kernels of the first releases.
OLD = IRISettings(
    steps=200,
    step_size=1 / 255,
    schedule="constant",
    momentum=0,
    extra_rounds=0,
    stop_below=None,
    fast_kernels=False,
)
# Training recipes of the test fixtures, per family.
RECIPES: dict[str, dict[str, Any]] = {
    "test_vit": {"arch_kwargs": {"img_size": 32}, "epochs": 15, "lr": 0.002, "batch_size": 32},
}
CNN_RECIPE: dict[str, Any] = {"epochs": 10, "lr": 0.01}


@dataclass
class Outcome:
    seconds: float
    cpu_seconds: float
    steps_used: float
    median: float
    p90: float

    @property
    def input_steps_per_s(self) -> float:
        return 0.0 if self.seconds == 0 else self.steps_used * self.n / self.seconds

    n: int = 0


def _model(arch: str, dataset: str, workdir: Path, device: torch.device) -> Network:
    path = workdir / f"{arch}-{dataset}.safetensors"
    if not path.exists():
        acc = make_checkpoint(path, arch, dataset, **RECIPES.get(arch, CNN_RECIPE))
        print(f"trained {arch} on {dataset}: test accuracy {acc:.3f}")
    model = build_model(
        ModelRef(checkpoint={"path": str(path)}), path, "", where="front", native_size=32
    )
    return Network(model, model.preprocess.input_size, device, "front")


def _run(
    net: Network,
    point: str,
    pixels: Any,
    settings: IRISettings,
    device: torch.device,
    banks: BankBuilder,
) -> Outcome:
    front = net.front(point)
    t0, c0 = time.perf_counter(), time.process_time()
    made = synthesize(front, pixels, settings, banks, device, lambda _n: None)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return Outcome(
        seconds,
        cpu,
        float(made.steps.mean()),
        float(np.median(made.final)),
        float(np.quantile(made.final, 0.9)),
        n=pixels.n,
    )


def _fmt(o: Outcome) -> str:
    return (
        f"{o.seconds:6.1f} s (cpu {o.cpu_seconds:6.1f} s) {o.input_steps_per_s:6.0f} "
        f"in-steps/s {o.steps_used:5.0f} steps median {o.median:.3f} p90 {o.p90:.3f}"
    )


def _fields(overrides: list[str]) -> set[str]:
    return {item.partition("=")[0] for item in overrides}


def _settings(overrides: list[str]) -> IRISettings:
    fields = {}
    for item in overrides:
        key, _, value = item.partition("=")
        fields[key] = json.loads(value)
    return IRISettings.model_validate(fields).at("low")  # the digits: 32 px


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--archs", default="test_resnet,test_vit,test_convnext")
    parser.add_argument("--dataset", default="digits_digit_only")
    parser.add_argument("--n", type=int, default=256, help="training inputs per IRI set")
    parser.add_argument("--points", help="comma-separated points (default: the stage outputs)")
    parser.add_argument(
        "--new",
        nargs="*",
        default=[],
        metavar="FIELD=JSON",
        help="override fields of the new settings (the defaults)",
    )
    parser.add_argument(
        "--old",
        nargs="*",
        default=[],
        metavar="FIELD=JSON",
        help="override fields of today's method (fast_kernels=true: the gain of the method alone)",
    )
    parser.add_argument("--skip-old", action="store_true", help="only the new method")
    parser.add_argument("--workdir", type=Path, help="keep the trained models here")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    device = pick_device(args.device)
    new = _settings(args.new)
    old_settings = OLD.model_copy(update=_settings(args.old).model_dump(include=_fields(args.old)))
    data = builtin(args.dataset)
    banks = BankBuilder(1 << 34)
    pixels = banks.new(args.n, tuple(data.train.images.shape[1:]))
    pixels.write(0, data.train.images[: args.n])
    print(
        f"IRIs of {args.n} {args.dataset} training inputs on {device} "
        f"({torch.get_num_threads()} threads)"
    )
    print(f"  old: {old_settings.model_dump()}")
    print(f"  new: {new.model_dump()} (cap {new.max_steps} steps)")
    totals = {"old": 0.0, "new": 0.0}
    cpu = {"old": 0.0, "new": 0.0}
    worst = {"old": (0.0, 0.0), "new": (0.0, 0.0)}
    further: list[str] = []  # points where the new IRIs are further than the old ones
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for arch in args.archs.split(","):
            net = _model(arch, args.dataset, workdir, device)
            points = args.points.split(",") if args.points else net.stage_points()
            for point in points:
                got = _run(net, point, pixels, new, device, banks)
                totals["new"] += got.seconds
                cpu["new"] += got.cpu_seconds
                worst["new"] = max(worst["new"], (got.median, got.p90))
                line = f"{arch:>14} {point:<12} new {_fmt(got)}"
                if not args.skip_old:
                    old = _run(net, point, pixels, old_settings, device, banks)
                    totals["old"] += old.seconds
                    cpu["old"] += old.cpu_seconds
                    worst["old"] = max(worst["old"], (old.median, old.p90))
                    mark = ""
                    if got.median > old.median or got.p90 > old.p90:
                        further.append(f"{arch} {point}")
                        mark = "  NEW FURTHER"
                    line += (
                        f"\n{'':>27} old {_fmt(old)}   time new/old "
                        f"{got.seconds / old.seconds:.2f}x (cpu "
                        f"{got.cpu_seconds / old.cpu_seconds:.2f}x){mark}"
                    )
                print(line, flush=True)
    print(
        f"total: new {totals['new']:.1f} s (cpu {cpu['new']:.1f} s; worst median, p90: "
        f"{worst['new'][0]:.3f}, {worst['new'][1]:.3f}; line {new.converged_below})"
    )
    if not args.skip_old:
        print(
            f"       old {totals['old']:.1f} s (cpu {cpu['old']:.1f} s; worst median, p90: "
            f"{worst['old'][0]:.3f}, {worst['old'][1]:.3f})"
        )
        print(
            f"       time new/old: {totals['new'] / totals['old']:.2f}x, cpu "
            f"{cpu['new'] / cpu['old']:.2f}x (goal <= 0.6x)"
        )
        print(
            f"       points where the new IRIs are further (median or p90): "
            f"{len(further)} ({', '.join(further) or 'none'})"
        )


if __name__ == "__main__":
    main()
