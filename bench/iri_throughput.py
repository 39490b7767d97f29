"""IRI synthesis throughput beside its floor: one forward + backward of the front part per step.

python bench/iri_throughput.py [--arch resnet18] [--point layer3] [--n 512] [--steps 20]
                               [--method paper]

The step fields are the method's preset (the paper's by default, the service's default), with
every sample taking every step: no early stopping, no extra rounds, a constant step.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import timm
import torch
from stitchsim.models import IRISettings, ModelRef
from stitchsim_worker.engine.core.bank import BankBuilder
from stitchsim_worker.engine.core.device import pick_device
from stitchsim_worker.engine.data.datasets import builtin
from stitchsim_worker.engine.iri.kernels import Kernels
from stitchsim_worker.engine.iri.synthesis import synthesize
from stitchsim_worker.engine.measures.metrics import per_sample_distance
from stitchsim_worker.engine.models.loading import build_model, save_checkpoint
from stitchsim_worker.engine.models.network import Network


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--arch", default="resnet18")
    parser.add_argument("--point", default="layer3")
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--method", default="paper",
                        help="IRI method whose preset the steps follow (catalogue.IRI_METHODS)")
    parser.add_argument(
        "--plain-kernels",
        action="store_true",
        help="IRISettings.fast_kernels false, for the floor and the synthesis",
    )
    args = parser.parse_args()
    device = pick_device(args.device)
    data = builtin("digits")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.safetensors"
        save_checkpoint(
            timm.create_model(args.arch, pretrained=False, num_classes=10),
            path,
            args.arch,
            {"num_classes": 10},
        )
        model = build_model(
            ModelRef(checkpoint={"path": str(path)}), path, "", where="front", native_size=32
        )
        net = Network(model, 32, device, "front")
        front = net.front(args.point)
        banks = BankBuilder(1 << 34)
        pixels = banks.new(args.n, (3, 32, 32))
        pixels.write(0, data.train.images[: args.n])
        # Every sample takes every step: this measures the cost of a step against the floor
        # (bench/iri_convergence.py measures the steps saved by early stopping and schedules).
        settings = IRISettings(
            method=args.method,
            steps=args.steps,
            batch_size=args.batch_size,
            schedule="constant",
            extra_rounds=0,
            stop_below=None,
            fast_kernels=not args.plain_kernels,
        ).at("low")  # the digits: 32 px

        # Floor: exactly one forward + backward of f<=i per step and batch, nothing else, on
        # the kernels the synthesis picks (IRISettings.fast_kernels).
        x = data.train.images[: args.batch_size].to(device)
        kernels = Kernels.pick(settings, device, front(x[:1]).dim())
        with torch.no_grad(), kernels.mode():
            target = front(kernels.images(x))

        def floor_step() -> None:
            xi = kernels.images(torch.rand_like(x)).requires_grad_(True)
            with kernels.mode():
                d = per_sample_distance(front(xi), target)
                torch.autograd.grad(d.sum(), xi)

        floor_step()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            floor_step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        floor = args.steps * args.batch_size / (time.perf_counter() - t0)

        t0 = time.perf_counter()
        made = synthesize(front, pixels, settings, banks, device, lambda _n: None)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    rate = args.n * args.steps / seconds
    print(
        f"IRI synthesis: {args.arch} up to {args.point}, {args.n} inputs x {args.steps} steps "
        f"on {device} ({torch.get_num_threads()} threads, {kernels}), method {args.method} "
        f"(momentum {settings.momentum}, step {settings.step_size:.4g}, "
        f"iterate {settings.iterate}, batch {settings.batch_size})"
    )
    print(f"  synthesis: {rate:10.0f} input-steps/s  ({seconds:.1f} s)")
    print(f"  floor:     {floor:10.0f} input-steps/s  (one forward+backward of the front part)")
    print(f"  ratio:     {floor / rate:10.2f}x the floor (target <= 1.3x)")
    print(
        f"  median relative distance: start {float(torch.tensor(made.start).median()):.3f} -> "
        f"{float(torch.tensor(made.final).median()):.3f}"
    )


if __name__ == "__main__":
    main()
