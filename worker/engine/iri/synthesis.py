"""Indistinguishable representation inputs (IRIs) and their content-addressed cache.

For every training input x, x' starts from uniform noise in [0,1] and takes signed-gradient
steps on d(f<=i(x'), f<=i(x)), clamped to the pixel range (and optionally to an L-inf ball
around x). The front model then cannot tell x' from x at the stitch point, while any model
that does not share its invariances can.

How (IRISettings, whose `method` presets the step fields: catalogue.IRI_METHODS; `paper` is the
invariance-aware paper's code, 200 constant steps of 1/255 on each step's own gradient, last
iterate, run on in rounds of 100 such steps while the median is short of the convergence line):
the step follows a cosine schedule (or stays constant) against the
sign of the gradient's running sum (`momentum`; 0: of the step's own gradient); each sample
keeps its best iterate or its last (`iterate`); a sample whose distance falls below
`stop_below` stops and leaves the batch (compaction: later steps cost only the live samples);
while a batch's median is short of the convergence line, extra rounds run (of
`extra_round_steps`, or as long as the first; or growing), up to `extra_rounds`; with
`extra_rounds_stop_at_aim`, only the samples still above the rounds' aim take them. On
the CPU, `fast_kernels` picks the memory format and the kernel of the pixel gradient (see
Kernels). Everything is a function of the settings and the seed: deterministic on one device type.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from stitchsim.models import IRISettings, IRIStats
from stitchsim_worker.engine.core.bank import Bank, BankBuilder
from stitchsim_worker.engine.core.device import autocast
from stitchsim_worker.engine.core.iri_cache import IRICache
from stitchsim_worker.engine.iri.kernels import Kernels
from stitchsim_worker.engine.measures.metrics import per_sample_distance, pixel_rms

log = logging.getLogger(__name__)
# Extra rounds run until a batch's median is below this share of the convergence line: a
# median that lands just under the line in one batch can sit on it in the whole set.
EXTRA_ROUNDS_AIM = 0.9


CACHE_FORMAT = "iri-v6"  # v2: schedules, early stopping, extra rounds; v3: fast kernels,
# extra rounds of one length and optionally stopping at the aim, the median as reported;
# v4: momentum; v5: the last iterate (iri.iterate), keyed by the effective settings only;
# v6: the paper method runs on in extra rounds of their own length (extra_round_steps) until
# converged, fp32 unless iri.precision asks for bf16, per-sample steps kept
# Fields that do not change the IRIs: the verdict's rule, not the synthesis.
_NOT_IN_KEY = {"method", "accept_unconverged"}


@dataclass
class IRIResult:
    images: Bank  # (N, 3, H, W) in [0, 1]
    stats: IRIStats


def cache_key(
    front_identity: dict[str, object], point: str, dataset_digest: str, settings: IRISettings
) -> str:
    """IRIs depend only on the front model, the stitch point, the data and the IRI settings
    that ran (the step resolved at the input resolution; the convergence line too, when it
    decides whether extra rounds run)."""
    assert settings.step_size is not None, "key IRIs by the settings that ran: call at()"
    # The method is a name for settings the key holds already: the same effective settings
    # under either name are the same IRIs.
    knobs = settings.model_dump(exclude=_NOT_IN_KEY if settings.extra_rounds
                                else {*_NOT_IN_KEY, "converged_below", "extra_round_steps"})
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
    on_skip: Callable[[int], None] | None = None,
) -> Synthesis:
    """IRIs for every sample, with per-sample start and final distances and steps taken;
    on_step(samples) after each step, with the number of samples it stepped; on_skip(sample
    steps) when samples leave short of the cap (converged, or their batch's rounds ended), with
    the steps of the cap they will not take: a batch's stepped and skipped sample-steps sum to
    its samples x settings.max_steps, so progress planned at the cap counts down to the end."""
    n = pixels.n
    out = banks.new(n, pixels.shape)
    start_d = np.zeros(n, dtype=np.float32)
    final_d = np.zeros(n, dtype=np.float32)
    steps = np.zeros(n, dtype=np.int32)
    noise = torch.Generator().manual_seed(settings.seed)
    for s in range(0, n, settings.batch_size):
        sl = slice(s, min(n, s + settings.batch_size))
        x = pixels[sl].to(device)
        batch = _synthesize_batch(front, x, settings, noise, on_step,
                                  on_skip or (lambda _n: None))
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
    peak = settings.step_size
    assert peak is not None, "IRI settings not resolved at the input resolution: call at()"
    if settings.schedule == "constant":
        return [peak] * length
    cycle = min(settings.cycle_steps * settings.extra_round_growth**round_index, length)
    return [
        peak * 0.5 * (1 + math.cos(math.pi * (t % cycle) / cycle))
        for t in range(length)
    ]


def round_lengths(settings: IRISettings) -> list[int]:
    """The first round, then the convergence-driven ones (IRISettings.round_lengths)."""
    return settings.round_lengths()


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


def _distance(
    front: Callable[[torch.Tensor], torch.Tensor],
    x_iri: torch.Tensor,
    target: torch.Tensor,
    kernels: Kernels,
    bf16: bool,
) -> torch.Tensor:
    with autocast(x_iri.device, bf16), kernels.mode():
        return per_sample_distance(front(kernels.images(x_iri)).float(), target)


def _synthesize_batch(
    front: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    settings: IRISettings,
    noise: torch.Generator,
    on_step: Callable[[int], None],
    on_skip: Callable[[int], None],
) -> _Batch:
    bf16 = settings.precision == "bf16"
    with torch.no_grad():
        kernels = Kernels.pick(settings, x.device, front(x[:1]).dim())
        # The target from the same kernels as the steps: at x' = x the distance is exactly 0.
        with autocast(x.device, bf16), kernels.mode():
            target = front(kernels.images(x)).float()
    x_iri = _project(torch.rand(x.shape, generator=noise).to(x.device), x, settings.linf)
    best = x_iri.clone()
    best_d = torch.full((len(x),), math.inf, device=x.device)
    start = torch.zeros(len(x), device=x.device)
    taken = torch.zeros(len(x), dtype=torch.int32, device=x.device)
    live = _Active(kernels.images(x), kernels.images(x_iri), target)
    aim = EXTRA_ROUNDS_AIM * settings.converged_below
    stop_below = settings.stop_below if settings.stop_below is not None else -1.0
    keep_best = settings.iterate == "best"
    cap = settings.max_steps

    def keep(mask: torch.Tensor) -> None:
        """The live samples of `mask` stay; the others leave, giving back the rest of their
        cap."""
        left = live.index[~mask]
        if len(left):
            on_skip(int((cap - taken[left]).sum()))
            live.keep(mask)

    def record(d: torch.Tensor, images: torch.Tensor, line: float) -> None:
        """Keep each sample's best iterate (or every iterate, the last one staying); stop the
        samples below the line."""
        better = d < best_d[live.index] if keep_best else torch.ones_like(d, dtype=torch.bool)
        best_d[live.index[better]] = d[better]
        best[live.index[better]] = images[better]
        keep(best_d[live.index] >= line)

    for r, length in enumerate(settings.round_lengths()):
        # The median as reported (the mean of the middle two of an even batch), not the lower one.
        if r > 0 and (len(live) == 0 or float(best_d.quantile(0.5)) < aim):
            keep(torch.zeros(len(live), dtype=torch.bool, device=x.device))
            break
        line = stop_below
        if r > 0 and settings.extra_rounds_stop_at_aim:
            # Samples under the aim already hold the median down: only the others need steps.
            line = max(stop_below, aim)
            keep(best_d[live.index] >= line)
        for t, lr in enumerate(step_schedule(settings, length, r)):
            if len(live) == 0:
                break
            xi = live.x_iri.requires_grad_(True)
            d = _distance(front, xi, live.target, kernels, bf16)
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
                d = _distance(front, live.x_iri, live.target, kernels, bf16)
                record(d, live.x_iri, line)
    return _Batch(best, start, best_d, taken)


def pixel_distances(images: Bank, pixels: Bank) -> np.ndarray:
    """Each IRI's RMS pixel distance from its training input, in [0,1] pixel units."""
    out = np.zeros(images.n, dtype=np.float32)
    for s in range(0, images.n, 1024):
        sl = slice(s, min(images.n, s + 1024))
        out[sl] = pixel_rms(images[sl], pixels[sl]).numpy()
    return out


def iri_stats(
    start: np.ndarray,
    final: np.ndarray,
    settings: IRISettings,
    *,
    cache_hit: bool,
    seconds: float,
    steps_used: float,
    pixels: np.ndarray | None = None,
) -> IRIStats:
    """The figures of a set of IRIs; pixels: each one's RMS pixel distance from its input."""
    median = float(np.median(final))
    return IRIStats(
        method=settings.method,
        pixel_rms=None if pixels is None else float(np.sqrt(np.mean(np.square(pixels)))),
        pixel_median=None if pixels is None else float(np.median(pixels)),
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
    on_skip: Callable[[int], None] | None = None,
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
            pixels=pixel_distances(bank, pixels),
        )
        return IRIResult(bank, stats)
    # Every method (catalogue.IRI_METHODS) is a preset of the settings: one generator runs them.
    made = synthesize(front, pixels, settings, banks, device, on_step, on_skip)
    seconds = time.perf_counter() - t0
    steps_used = float(made.steps.mean())
    meta = {"settings": settings.model_dump(), "seconds": seconds, "steps_used": steps_used}
    cache.store(key, made.images, made.start, made.final, meta)
    stats = iri_stats(
        made.start, made.final, settings, cache_hit=False, seconds=seconds,
        steps_used=steps_used, pixels=pixel_distances(made.images, pixels),
    )
    return IRIResult(made.images, stats)
