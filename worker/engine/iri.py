"""Indistinguishable representation inputs (IRIs) and their content-addressed cache.

For every training input x, x' starts from uniform noise in [0,1] and takes signed-gradient
steps on d(f<=i(x'), f<=i(x)), clamped to the pixel range (and optionally to an L-inf ball
around x). The front model then cannot tell x' from x at the stitch point, while any model
that does not share its invariances can.

How (IRISettings): the step follows a cosine schedule (or stays constant, the original
method) against the sign of the gradient's running sum (`momentum`; 0: of the step's own
gradient); each sample keeps its best iterate; a sample whose distance falls below
`stop_below` stops and leaves the batch (compaction: later steps cost only the live samples);
while a batch's median is short of the convergence line, extra rounds run (each as long as
the first, or growing), up to `extra_rounds`; with `extra_rounds_stop_at_aim`, only the
samples still above the rounds' aim take them. On the CPU, `fast_kernels` picks the memory
format and the kernel of the pixel gradient (see Kernels). Everything is a function of the
settings and the
seed: deterministic on one device type.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from stitchsim.models import IRISettings, IRIStats
from stitchsim_worker.engine.bank import Bank, BankBuilder
from stitchsim_worker.engine.data import file_sha256
from stitchsim_worker.engine.device import autocast
from stitchsim_worker.engine.metrics import per_sample_distance
from torch.overrides import TorchFunctionMode

log = logging.getLogger(__name__)
# Extra rounds run until a batch's median is below this share of the convergence line: a
# median that lands just under the line in one batch can sit on it in the whole set.
EXTRA_ROUNDS_AIM = 0.9
CACHE_FORMAT = "iri-v4"  # v2: schedules, early stopping, extra rounds; v3: fast kernels,
# extra rounds of one length and optionally stopping at the aim, the median as reported;
# v4: momentum


@dataclass
class IRIResult:
    images: Bank  # (N, 3, H, W) in [0, 1]
    stats: IRIStats


def cache_key(
    front_identity: dict[str, object], point: str, dataset_digest: str, settings: IRISettings
) -> str:
    """IRIs depend only on the front model, the stitch point, the data and the IRI settings
    (the convergence line too, when it decides whether extra rounds run)."""
    knobs = settings.model_dump(exclude=set() if settings.extra_rounds else {"converged_below"})
    blob = json.dumps(
        {
            "format": CACHE_FORMAT,
            "front": front_identity,
            "point": point,
            "data": dataset_digest,
            "iri": knobs,
            "aim": EXTRA_ROUNDS_AIM if settings.extra_rounds else None,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


class IRICache:
    """Entries are directories written whole, then renamed into place; every file's hash is
    recorded and checked on load, so a partial or corrupt entry is rebuilt, never used."""

    def __init__(self, root: Path):
        self.root = root / "iri"

    def _dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    def load(self, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict] | None:
        entry = self._dir(key)
        meta_path = entry / "meta.json"
        if not meta_path.is_file():
            return None
        try:
            meta = json.loads(meta_path.read_text())
            for name, digest in meta["files"].items():
                if file_sha256(entry / name) != digest:
                    raise ValueError(f"{name} does not match its recorded hash")
            images = np.load(entry / "images.npy", mmap_mode="r")
            start = np.load(entry / "start.npy")
            final = np.load(entry / "final.npy")
        except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
            log.warning("IRI cache entry %s is corrupt (%s); rebuilding it", key, e)
            shutil.rmtree(entry, ignore_errors=True)
            return None
        return images, start, final, meta

    def store(
        self, key: str, images: Bank, start: np.ndarray, final: np.ndarray, meta: dict
    ) -> None:
        """Write an entry; a cache that cannot be written (disk full, read-only) only costs
        the next job the synthesis, so the job goes on without it."""
        # Workers on other hosts may share this cache and reuse pids: a random name is unique.
        tmp = self._dir(key).with_name(f".{key}.{uuid.uuid4().hex}.tmp")
        try:
            self._write(tmp, key, images, start, final, meta)
        except OSError as e:
            log.warning("IRI cache entry %s not written (%s); going on without it", key, e)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self._forget_abandoned()

    def _write(
        self, tmp: Path, key: str, images: Bank, start: np.ndarray, final: np.ndarray, meta: dict
    ) -> None:
        entry = self._dir(key)
        tmp.mkdir(parents=True)
        out = np.lib.format.open_memmap(
            tmp / "images.npy", mode="w+", dtype=np.float32, shape=(images.n, *images.shape)
        )
        for s in range(0, images.n, 1024):
            out[s : s + 1024] = images[slice(s, min(images.n, s + 1024))].numpy()
        out.flush()
        del out
        np.save(tmp / "start.npy", start)
        np.save(tmp / "final.npy", final)
        files = {name: file_sha256(tmp / name) for name in ("images.npy", "start.npy", "final.npy")}
        (tmp / "meta.json").write_text(json.dumps({**meta, "files": files}))
        if (entry / "meta.json").exists():  # a concurrent job finished the same entry first
            return
        shutil.rmtree(entry, ignore_errors=True)  # a partial entry left by a dead writer
        try:
            os.replace(tmp, entry)
        except OSError:
            # Another writer's complete entry landed in between: keep theirs.
            if not (entry / "meta.json").exists():
                raise

    def _forget_abandoned(self, older_than_s: float = 24 * 3600) -> None:
        # Temp dirs of writers killed mid-write are never read; a day is far longer than any
        # write, so an old one has no live writer.
        cutoff = time.time() - older_than_s
        for tmp in self.root.glob("*/.*.tmp"):
            with contextlib.suppress(OSError):
                if tmp.stat().st_mtime < cutoff:
                    shutil.rmtree(tmp, ignore_errors=True)


@dataclass
class Synthesis:
    images: Bank
    start: np.ndarray
    final: np.ndarray
    steps: np.ndarray  # steps each sample took


def synthesize(
    front: Callable[[torch.Tensor], torch.Tensor],
    pixels: Bank,
    settings: IRISettings,
    banks: BankBuilder,
    device: torch.device,
    on_step: Callable[[int], None],
) -> Synthesis:
    """IRIs for every sample, with per-sample start and final distances and steps taken;
    on_step(samples) after each step, with the number of samples it stepped."""
    n = pixels.n
    out = banks.new(n, pixels.shape)
    start_d = np.zeros(n, dtype=np.float32)
    final_d = np.zeros(n, dtype=np.float32)
    steps = np.zeros(n, dtype=np.int32)
    noise = torch.Generator().manual_seed(settings.seed)
    for s in range(0, n, settings.batch_size):
        sl = slice(s, min(n, s + settings.batch_size))
        x = pixels[sl].to(device)
        batch = _synthesize_batch(front, x, settings, noise, on_step)
        out.write(s, batch.images)
        start_d[sl], final_d[sl] = batch.start.cpu().numpy(), batch.final.cpu().numpy()
        steps[sl] = batch.steps.cpu().numpy()
    return Synthesis(out, start_d, final_d, steps)


@dataclass
class _Batch:
    images: torch.Tensor
    start: torch.Tensor
    final: torch.Tensor
    steps: torch.Tensor


def step_schedule(settings: IRISettings, length: int, round_index: int = 0) -> list[float]:
    """Step sizes of one round. Cosine: large steps cross the noise floor fast, the small ones
    at the end of each cycle settle into a minimum. Cycles restart every cycle_steps in the
    first round and are extra_round_growth times as long in each extra round."""
    if settings.schedule == "constant":
        return [settings.step_size] * length
    cycle = min(settings.cycle_steps * settings.extra_round_growth**round_index, length)
    return [
        settings.step_size * 0.5 * (1 + math.cos(math.pi * (t % cycle) / cycle))
        for t in range(length)
    ]


def round_lengths(settings: IRISettings) -> list[int]:
    """The first round, then the convergence-driven ones, each extra_round_growth times the
    one before. Rounds of one cycle each (the default) end where the median is checked: a batch
    that has converged takes no more steps than it needs, to the cycle (bench/iri_convergence:
    at a CNN's stage points the first release's doubling rounds took 300-700 steps, equal
    ones 200-500 to a median no further than the old method's)."""
    return [
        settings.steps * settings.extra_round_growth**r for r in range(settings.extra_rounds + 1)
    ]


def _project(x_iri: torch.Tensor, x: torch.Tensor, linf: float | None) -> torch.Tensor:
    if linf is not None:
        x_iri = torch.maximum(torch.minimum(x_iri, x + linf), x - linf)
    return x_iri.clamp(0, 1)


class _Active:
    """The samples still being stepped, compacted: stopped ones leave the tensors, so a step
    costs a forward and backward of the live samples only."""

    def __init__(self, x: torch.Tensor, x_iri: torch.Tensor, target: torch.Tensor):
        self.index = torch.arange(len(x), device=x.device)
        self.x, self.x_iri, self.target = x, x_iri, target
        self.velocity = torch.zeros_like(x_iri)

    def keep(self, mask: torch.Tensor) -> None:
        self.index, self.x = self.index[mask], self.x[mask]
        self.x_iri, self.target = self.x_iri[mask], self.target[mask]
        self.velocity = self.velocity[mask]

    def direction(self, grad: torch.Tensor, momentum: float) -> torch.Tensor:
        """The sign each sample steps against. Plain signed steps oscillate across the narrow
        valleys a ReLU stem makes of the distance (test_resnet's act1: median 0.40 after 100
        steps, 0.16 with momentum 0.9; bench/iri_convergence.py); a running sum keeps the
        direction that holds. Each gradient is scaled to unit mean magnitude first, so one
        sample's large early gradients do not outweigh the steps that follow (MI-FGSM)."""
        if momentum == 0:
            return grad.sign()
        scale = grad.abs().flatten(1).mean(1).clamp_min(torch.finfo(grad.dtype).tiny)
        self.velocity = momentum * self.velocity + grad / scale.view(-1, *[1] * (grad.dim() - 1))
        return self.velocity.sign()

    def __len__(self) -> int:
        return len(self.index)


# oneDNN computes the input gradient of a convolution with this few input channels (the one
# that reads the pixels) 2-15x slower than the native kernel (a ViT's patch embedding: most of
# a step); every other convolution is faster in oneDNN.
FEW_CHANNELS = 4


class _PixelConvGrad(torch.autograd.Function):
    """conv2d whose input gradient comes from the native kernel (the weights are frozen)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        stride: list[int],
        padding: list[int],
        dilation: list[int],
        groups: int,
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.conv = (stride, padding, dilation, groups)  # type: ignore[attr-defined]
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors  # type: ignore[attr-defined]
        stride, padding, dilation, groups = ctx.conv  # type: ignore[attr-defined]
        with torch.backends.mkldnn.flags(enabled=False):
            gx = torch.ops.aten.convolution_backward(
                grad.contiguous(),
                x.contiguous(),
                weight,
                None,
                stride,
                padding,
                dilation,
                False,
                [0, 0],
                groups,
                [True, False, False],
            )[0]
        return gx, None, None, None, None, None, None


def _pair(v: int | tuple[int, ...] | list[int]) -> list[int]:
    return [v, v] if isinstance(v, int) else list(v)


class _PixelConvMode(TorchFunctionMode):
    """Routes the few-channel convolutions of a front through _PixelConvGrad, without touching
    the model: only while a step runs, and only where the input needs a gradient and the
    weights do not (the only case _PixelConvGrad handles)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is F.conv2d or func is torch.conv2d:
            call = dict(
                zip(
                    ("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
                    args,
                    strict=False,
                ),
                **kwargs,
            )
            x, w, b = call["input"], call["weight"], call.get("bias")
            padding = call.get("padding", 0)
            if (
                x.dim() == 4
                and x.shape[1] <= FEW_CHANNELS
                and x.requires_grad
                and not w.requires_grad
                and (b is None or not b.requires_grad)
                and not isinstance(padding, str)
            ):
                return _PixelConvGrad.apply(
                    x,
                    w,
                    b,
                    _pair(call.get("stride", 1)),
                    _pair(padding),
                    _pair(call.get("dilation", 1)),
                    int(call.get("groups", 1)),
                )
        return func(*args, **kwargs)


@dataclass(frozen=True)
class Kernels:
    """How a step runs (IRISettings.fast_kernels). Channels-last images: oneDNN runs a
    convolutional front up to twice as fast on NHWC on the CPU (a ViT's tokens gain nothing);
    the pixel convolution's gradient from the native kernel (FEW_CHANNELS). Both change only
    float rounding."""

    memory_format: torch.memory_format = torch.contiguous_format
    pixel_conv_grad: bool = False

    @staticmethod
    def pick(settings: IRISettings, device: torch.device, point_dims: int) -> Kernels:
        if not settings.fast_kernels or device.type != "cpu":
            # On GPUs the network takes channels-last inputs itself and bf16 autocast applies.
            return Kernels()
        fmt = torch.channels_last if point_dims == 4 else torch.contiguous_format
        return Kernels(fmt, pixel_conv_grad=True)

    def images(self, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous(memory_format=self.memory_format)

    def mode(self) -> contextlib.AbstractContextManager[object]:
        return _PixelConvMode() if self.pixel_conv_grad else contextlib.nullcontext()


def _distance(
    front: Callable[[torch.Tensor], torch.Tensor],
    x_iri: torch.Tensor,
    target: torch.Tensor,
    kernels: Kernels,
) -> torch.Tensor:
    with autocast(x_iri.device), kernels.mode():
        return per_sample_distance(front(kernels.images(x_iri)).float(), target)


def _synthesize_batch(
    front: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    settings: IRISettings,
    noise: torch.Generator,
    on_step: Callable[[int], None],
) -> _Batch:
    with torch.no_grad():
        kernels = Kernels.pick(settings, x.device, front(x[:1]).dim())
        # The target from the same kernels as the steps: at x' = x the distance is exactly 0.
        with autocast(x.device), kernels.mode():
            target = front(kernels.images(x)).float()
    x_iri = _project(torch.rand(x.shape, generator=noise).to(x.device), x, settings.linf)
    best = x_iri.clone()
    best_d = torch.full((len(x),), math.inf, device=x.device)
    start = torch.zeros(len(x), device=x.device)
    taken = torch.zeros(len(x), dtype=torch.int32, device=x.device)
    live = _Active(kernels.images(x), kernels.images(x_iri), target)
    aim = EXTRA_ROUNDS_AIM * settings.converged_below
    stop_below = settings.stop_below if settings.stop_below is not None else -1.0

    def record(d: torch.Tensor, images: torch.Tensor, line: float) -> None:
        """Keep each sample's best iterate; stop the samples below the line."""
        better = d < best_d[live.index]
        best_d[live.index[better]] = d[better]
        best[live.index[better]] = images[better]
        done = best_d[live.index] < line
        if done.any():
            live.keep(~done)

    for r, length in enumerate(round_lengths(settings)):
        # The median as reported (the mean of the middle two of an even batch), not the lower one.
        if r > 0 and (len(live) == 0 or float(best_d.quantile(0.5)) < aim):
            break
        line = stop_below
        if r > 0 and settings.extra_rounds_stop_at_aim:
            # Samples under the aim already hold the median down: only the others need steps.
            line = max(stop_below, aim)
            live.keep(best_d[live.index] >= line)
        for t, lr in enumerate(step_schedule(settings, length, r)):
            if len(live) == 0:
                break
            xi = live.x_iri.requires_grad_(True)
            d = _distance(front, xi, live.target, kernels)
            (grad,) = torch.autograd.grad(d.sum(), xi)
            d, xi = d.detach(), xi.detach()
            if r == 0 and t == 0:
                start = d.clone()
            taken[live.index] += 1
            with torch.no_grad():
                step = lr * live.direction(grad, settings.momentum)
                live.x_iri = kernels.images(_project(xi - step, live.x, settings.linf))
            stepped = len(live)
            record(d, xi, line)  # d is the distance of the iterate before this step
            on_step(stepped)
        if len(live):  # the last step's iterate has not been measured yet
            with torch.no_grad():
                d = _distance(front, live.x_iri, live.target, kernels)
                record(d, live.x_iri, line)
    return _Batch(best, start, best_d, taken)


def iri_stats(
    start: np.ndarray,
    final: np.ndarray,
    settings: IRISettings,
    *,
    cache_hit: bool,
    seconds: float,
    steps_used: float,
) -> IRIStats:
    median = float(np.median(final))
    return IRIStats(
        start_median=float(np.median(start)),
        median=median,
        p90=float(np.quantile(final, 0.9)),
        max=float(final.max()),
        converged=median < settings.converged_below,
        cache_hit=cache_hit,
        n=int(len(final)),
        seconds=seconds,
        converged_below=settings.converged_below,
        steps=settings.max_steps,
        steps_used=steps_used,
    )


def get_iris(
    *,
    key: str,
    cache: IRICache,
    front: Callable[[torch.Tensor], torch.Tensor],
    pixels: Bank,
    settings: IRISettings,
    banks: BankBuilder,
    device: torch.device,
    on_step: Callable[[int], None],
) -> IRIResult:
    t0 = time.perf_counter()
    hit = cache.load(key)
    if hit is not None:
        images, start, final, meta = hit
        bank = banks.new(len(images), tuple(images.shape[1:]))
        for s in range(0, len(images), 1024):
            bank.write(s, torch.from_numpy(np.array(images[s : s + 1024])))
        stats = iri_stats(
            start,
            final,
            settings,
            cache_hit=True,
            steps_used=meta["steps_used"],
            seconds=time.perf_counter() - t0,
        )
        return IRIResult(bank, stats)
    made = synthesize(front, pixels, settings, banks, device, on_step)
    seconds = time.perf_counter() - t0
    steps_used = float(made.steps.mean())
    meta = {"settings": settings.model_dump(), "seconds": seconds, "steps_used": steps_used}
    cache.store(key, made.images, made.start, made.final, meta)
    stats = iri_stats(
        made.start, made.final, settings, cache_hit=False, seconds=seconds, steps_used=steps_used
    )
    return IRIResult(made.images, stats)
