"""IRI synthesis throughput beside its floor: one forward + backward of the front part per step.

python bench/iri_throughput.py [--arch resnet18] [--point layer3] [--n 512] [--steps 20]
                               [--method paper]
python bench/iri_throughput.py --roofline [--steps 3] [--out bench/results/....json]

The step fields are the method's preset (the paper's by default, the service's default), with
every sample taking every step: no early stopping, no extra rounds, a constant step.

--roofline (issue 48 item 1): how far an IRI step is from what this CPU can do. For the demo's
test_resnet at 32 px (up to layer2, the demo's deepest point), resnet18 at 32 px (layer3) and
resnet50 at 224 px (layer3, a small batch to keep it cheap): the FLOPs of one step (one forward
and backward of the front part, counted by torch.utils.flop_counter), its achieved GFLOP/s, and
the machine's measured fp32 peak (a 2048 x 2048 matmul on the same threads), as a ratio; then,
side by side on the same inputs, the variants: contiguous vs channels-last (the service's
fast_kernels), torch.compile (inductor) of the front, one thread vs all, half and double the
batch; each with its step time, speed-up over the service's step and the largest relative
difference of its pixel gradient from the service's (equal figures within float tolerance).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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


# (arch, arch_kwargs, point, input px, batch): the service's IRI batch (256; the demo's 128
# training samples make one batch of 128), resnet50 at 224 px at a small batch.
ROOFLINE_MODELS: tuple[tuple[str, dict[str, object], str, int, int], ...] = (
    ("test_resnet", {"stem_width": 64, "channels": [128, 128, 128, 192]}, "layer2", 32, 128),
    ("resnet18", {}, "layer3", 32, 256),
    ("resnet50", {}, "layer3", 224, 8),
)


def matmul_peak(threads: int, n: int = 2048, repeats: int = 5) -> float:
    """GFLOP/s of an n x n fp32 matmul on `threads` threads: the best of a few (on a shared
    machine the best is the one least disturbed)."""
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = math.inf
    for _ in range(repeats):
        t0 = _clock()
        a @ b
        best = min(best, _clock() - t0)
    return 2 * n**3 / best / 1e9


def _front(arch: str, kwargs: dict[str, object], point: str, px: int) -> Any:
    from stitchsim_worker.engine.models.network import Network

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.safetensors"
        save_checkpoint(timm.create_model(arch, pretrained=False, num_classes=10, **kwargs),
                        path, arch, {"num_classes": 10, **kwargs})
        model = build_model(ModelRef(checkpoint={"path": str(path)}), path, "",
                            where="front", native_size=px)
        return Network(model, px, torch.device("cpu"), "front").front(point)


def _step_fn(front: Any, kernels: Kernels, x: torch.Tensor) -> Any:
    """One IRI step's work (forward and backward of the front part) from a fixed start, so
    every variant computes the same gradient."""
    with torch.no_grad(), kernels.mode():
        target = front(kernels.images(x))
    start = torch.rand(x.shape, generator=torch.Generator().manual_seed(0))

    def step() -> torch.Tensor:
        xi = kernels.images(start).requires_grad_(True)
        with kernels.mode():
            d = per_sample_distance(front(xi), target)
            (g,) = torch.autograd.grad(d.sum(), xi)
        return g

    return step


def _clock() -> float:
    """On one thread, this process's CPU seconds: on a machine shared with other work, wall
    time measures the neighbours (a 2-core EPYC at load 5-8 gave one step 1 s and, a minute
    later, 13 s); on more threads, wall time (CPU seconds would add the threads up)."""
    return time.process_time() if torch.get_num_threads() == 1 else time.perf_counter()


def _timed(step: Any, steps: int) -> tuple[float, torch.Tensor]:
    """Seconds a step (the best of `steps`, after one warm-up) and the gradient."""
    g = step()
    best = math.inf
    for _ in range(steps):
        t0 = _clock()
        step()
        best = min(best, _clock() - t0)
    return best, g


def _flops(step: Any) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops()


def roofline(steps: int, threads: int, compile_front: bool) -> list[dict[str, Any]]:
    peaks = {t: matmul_peak(t) for t in sorted({1, threads})}
    rows = []
    for arch, kwargs, point, px, batch in ROOFLINE_MODELS:
        found = _model_rows(arch, kwargs, point, px, batch, steps=steps, threads=threads,
                            peaks=peaks, compile_front=compile_front)
        for r in found:
            print(f"{arch:>12} {px:>3}px b{r['batch']:<4} t{r['threads']} "
                  f"{r['variant']:<40} {r['gflop_step']:8.2f} GFLOP {r['step_s']:8.3f} s "
                  f"{r['gflops']:7.1f} GFLOP/s  {r['of_peak']:6.1%} of {r['peak_gflops']:.0f}"
                  f"  x{r['speedup']:.2f}  grad diff {r['grad_rel_diff'] or 0:.1e}", flush=True)
        rows += found
    return rows


def _model_rows(arch: str, kwargs: dict[str, object], point: str, px: int, batch: int, *,
                steps: int, threads: int, peaks: dict[int, float],
                compile_front: bool) -> list[dict[str, Any]]:
    """One model's step under the service's kernels, then each variant beside it."""
    fast = Kernels(torch.channels_last, pixel_conv_grad=True)
    torch.set_num_threads(threads)
    front = _front(arch, kwargs, point, px)
    x = torch.rand(batch, 3, px, px, generator=torch.Generator().manual_seed(1))
    flops = _flops(_step_fn(front, Kernels(), x))
    base_s, base_g = _timed(_step_fn(front, fast, x), steps)

    def row(variant: str, seconds: float, g: torch.Tensor | None, n: int = batch,
            t: int = threads, **extra: Any) -> dict[str, Any]:
        f = flops * n / batch
        gflops = f / seconds / 1e9
        diff = None if g is None else float((g - base_g).norm() / base_g.norm())
        return {"arch": arch, "point": point, "px": px, "batch": n, "threads": t,
                "variant": variant, "gflop_step": round(f / 1e9, 3),
                "step_s": round(seconds, 4), "gflops": round(gflops, 2),
                "peak_gflops": round(peaks[t], 1), "of_peak": round(gflops / peaks[t], 3),
                # samples a second against the service's step
                "speedup": round(base_s / seconds * n / batch, 3),
                "grad_rel_diff": diff, **extra}

    rows = [row("channels-last (service)", base_s, None)]
    s, g = _timed(_step_fn(front, Kernels(), x), steps)
    rows.append(row("contiguous", s, g))
    for n in (batch // 2, batch * 2):
        xs = torch.rand(n, 3, px, px, generator=torch.Generator().manual_seed(1))
        s, _ = _timed(_step_fn(front, fast, xs), steps)
        rows.append(row("batch", s, None, n=n))
    if threads > 1:
        torch.set_num_threads(1)
        s, g = _timed(_step_fn(front, fast, x), steps)
        rows.append(row("one thread", s, g, t=1))
        torch.set_num_threads(threads)
    if compile_front:
        t0 = time.perf_counter()
        step = _step_fn(torch.compile(front), Kernels(torch.channels_last), x)
        step()  # the compile itself
        compile_s = time.perf_counter() - t0
        s, g = _timed(step, steps)
        rows.append(row("torch.compile (inductor), channels-last", s, g,
                        compile_s=round(compile_s, 1)))
    return rows


def roofline_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description="--roofline: " + __doc__)
    parser.add_argument("--roofline", action="store_true")
    parser.add_argument("--steps", type=int, default=3, help="timed steps a variant (the best)")
    parser.add_argument("--threads", type=int, default=1,
                        help="1 (the default): timed in CPU seconds, robust to a shared "
                        "machine; more: wall time, with a one-thread row beside it")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    load0 = os.getloadavg()
    rows = roofline(args.steps, args.threads, not args.no_compile)
    result = {"torch": torch.__version__, "threads": args.threads,
              "load_avg_before": load0, "load_avg_after": os.getloadavg(),
              "seconds": round(time.perf_counter() - t0, 1), "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    if "--roofline" in sys.argv:
        roofline_main(sys.argv[1:])
    else:
        main()
