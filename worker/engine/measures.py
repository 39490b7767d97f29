"""Representation similarity measures beside stitching (issue 14), one registered entry each.

A measure compares the two models' activations at one stitch pair on the same inputs, with
nothing fitted: on the test split's real images, and on the front model's IRIs (both models'
activations on them), which is what makes it invariance-aware. The activations are the ones
the job already computes: f<=i on the test split (the test split of the stitch), g_j on IRIs
(the invariance-aware protocol's training split); only g_j on the test split is one extra
pass per stitch pair.

Every measure works on mini-batches of a fixed, seeded partition of the samples, so memory
stays bounded on large test sets, and reports a 95% bootstrap interval over samples. Adding a
measure is one `register_measure` call plus its name in the contract's `Measure`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from stitchsim.models import (
    Control,
    Measure,
    MeasureInput,
    MeasureRow,
    MeasureSettings,
    Protocol,
    Spec,
)
from stitchsim_worker.engine.bank import Bank
from stitchsim_worker.engine.context import EVAL_BATCH, Cut, JobContext
from stitchsim_worker.engine.data import clustered_noise
from stitchsim_worker.engine.errors import SpecError
from stitchsim_worker.engine.metrics import BOOTSTRAP_RESAMPLES, bootstrap
from stitchsim_worker.engine.protocols import PROTOCOLS, iri_units
from stitchsim_worker.engine.splits import InputSet, Split

_QUANTILES = (0.025, 0.975)


@dataclass(frozen=True)
class Estimate:
    value: float
    ci: tuple[float, float]


@dataclass(frozen=True)
class MeasureEntry:
    name: Measure
    label: str
    description: str
    estimate: Callable[[list[torch.Tensor], list[torch.Tensor], MeasureSettings, int],
                       Estimate]
    """(X batches, Y batches, settings, seed) -> value and bootstrap interval; batch b of X
    and of Y hold the same samples as rows (flattened activations, float64)."""


MEASURES: dict[str, MeasureEntry] = {}


def register_measure(entry: MeasureEntry) -> MeasureEntry:
    if entry.name in MEASURES:
        raise ValueError(f"measure {entry.name!r} is registered twice")
    MEASURES[entry.name] = entry
    return entry


# ---------------------------------------------------------------- linear CKA


def gram(x: torch.Tensor) -> torch.Tensor:
    """Linear kernel of the batch's rows, with a zero diagonal (the unbiased estimator's K~).
    Rows are centred first: the estimator is invariant to it, and it keeps off-diagonal
    entries small, so leaving out the pairs of a resampled sample with its own copies (see
    weighted_hsic1) biases the bootstrap little."""
    xc = x - x.mean(0, keepdim=True)
    k = xc @ xc.T
    return k.fill_diagonal_(0.0)


def hsic1(k: torch.Tensor, lk: torch.Tensor) -> torch.Tensor:
    """Unbiased HSIC (Song et al. 2012) of zero-diagonal kernels (..., n, n), batched:
    [tr(KL) + 1'K1 1'L1 / ((n-1)(n-2)) - 2/(n-2) 1'KL1] / (n(n-3))."""
    n = k.shape[-1]
    trace = (k * lk).sum((-2, -1))  # tr(KL) for symmetric K, L
    ks, ls = k.sum(-1), lk.sum(-1)
    total = ks.sum(-1) * ls.sum(-1) / ((n - 1) * (n - 2))
    return (trace + total - 2.0 * (ks * ls).sum(-1) / (n - 2)) / (n * (n - 3))


def cka_from_sums(xy: torch.Tensor, xx: torch.Tensor, yy: torch.Tensor) -> torch.Tensor:
    """Mini-batch CKA (Nguyen et al. 2021): sum of HSIC(X,Y) over batches over the geometric
    mean of the sums of HSIC(X,X) and HSIC(Y,Y)."""
    return xy / (xx * yy).clamp_min(1e-300).sqrt()


def weighted_hsic1(k: torch.Tensor, lk: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """hsic1 of the batch resampled with multiplicities w (R, n): a sample drawn twice is no
    pair of distinct samples, so its copies meet only through K's zero diagonal, and every
    term of the estimator is a quadratic or cubic form in w (no resampled matrix is built)."""
    n = k.shape[-1]
    kw, lw = w @ k, w @ lk  # (K w)_i, (L w)_i per resample
    trace = (w @ (k * lk) * w).sum(-1)
    total = (kw * w).sum(-1) * (lw * w).sum(-1) / ((n - 1) * (n - 2))
    cross = (w * kw * lw).sum(-1)
    return (trace + total - 2.0 * cross / (n - 2)) / (n * (n - 3))


def _boot_hsic(
    kx: torch.Tensor, ky: torch.Tensor, gen: torch.Generator, resamples: int
) -> torch.Tensor:
    """(resamples, 3) HSIC of (X,Y), (X,X), (Y,Y) on bootstrap resamples of one batch."""
    m = kx.shape[0]
    idx = torch.randint(0, m, (resamples, m), generator=gen)
    w = torch.zeros(resamples, m, dtype=kx.dtype).scatter_add_(
        1, idx, torch.ones(resamples, m, dtype=kx.dtype)).to(kx.device)
    return torch.stack([weighted_hsic1(kx, ky, w), weighted_hsic1(kx, kx, w),
                        weighted_hsic1(ky, ky, w)], -1)


def linear_cka(
    xs: list[torch.Tensor], ys: list[torch.Tensor], _settings: MeasureSettings, seed: int
) -> Estimate:
    gen = torch.Generator().manual_seed(seed)
    sums = torch.zeros(3, dtype=torch.float64, device=xs[0].device)
    boot = torch.zeros(BOOTSTRAP_RESAMPLES, 3, dtype=torch.float64, device=xs[0].device)
    for x, y in zip(xs, ys, strict=True):
        kx, ky = gram(x), gram(y)
        sums += torch.stack([hsic1(kx, ky), hsic1(kx, kx), hsic1(ky, ky)])
        # Resampled within each batch: the estimator is built batch by batch.
        boot += _boot_hsic(kx, ky, gen, BOOTSTRAP_RESAMPLES)
    value = cka_from_sums(*sums)
    dist = cka_from_sums(boot[:, 0], boot[:, 1], boot[:, 2])
    return Estimate(float(value), _interval(dist))


register_measure(MeasureEntry(
    name="cka", label="linear CKA",
    description="linear centred kernel alignment, unbiased HSIC accumulated over mini-batches "
    "(as in the invariance-aware paper's code); 1 for representations equal up to rotation "
    "and scale",
    estimate=linear_cka,
))


# ---------------------------------------------------------------- mutual k-NN


def knn_overlap(x: torch.Tensor, y: torch.Tensor, k: int) -> torch.Tensor:
    """Per sample: the share of its k nearest neighbours (cosine, itself excluded) that the
    two representations have in common (Huh et al. 2024, the platonic representation)."""

    def neighbours(z: torch.Tensor) -> torch.Tensor:
        zn = torch.nn.functional.normalize(z, dim=1)
        sim = zn @ zn.T
        sim.fill_diagonal_(-math.inf)
        return sim.topk(k, dim=1).indices

    nx, ny = neighbours(x), neighbours(y)
    common = (nx[:, :, None] == ny[:, None, :]).any(-1).sum(-1)
    return common.double() / k


def mutual_knn(
    xs: list[torch.Tensor], ys: list[torch.Tensor], settings: MeasureSettings, seed: int
) -> Estimate:
    k = settings.knn_k
    smallest = min(len(x) for x in xs)
    if smallest <= k:
        raise SpecError(
            f"mutual_knn needs more than knn_k={k} samples per mini-batch, but a batch holds "
            f"{smallest}; lower measure_settings.knn_k or use more test samples"
        )
    scores = torch.cat([knn_overlap(x, y, k) for x, y in zip(xs, ys, strict=True)]).cpu()
    # Neighbourhoods are fixed by the batches; the resampling is over per-sample scores,
    # exactly as for agreement.
    ci = bootstrap(lambda idx: scores[idx].mean(-1, keepdim=True), len(scores), seed)
    return Estimate(float(scores.mean()), (float(ci[0, 0]), float(ci[1, 0])))


register_measure(MeasureEntry(
    name="mutual_knn", label="mutual k-NN alignment",
    description="mean share of each sample's k nearest neighbours (cosine, within its "
    "mini-batch) that both representations agree on; 1 when the neighbourhoods match",
    estimate=mutual_knn,
))


def _interval(dist: torch.Tensor) -> tuple[float, float]:
    q = torch.quantile(dist.double().cpu(), torch.tensor(_QUANTILES, dtype=torch.float64))
    return float(q[0]), float(q[1])


# ---------------------------------------------------------------- on banks


def partition(n: int, batch_size: int, seed: int) -> list[torch.Tensor]:
    """A seeded shuffle of the samples cut into near-equal mini-batches (no runt batch: the
    unbiased HSIC needs 4 samples, k-NN more than k), so class-sorted data mixes."""
    if n < 4:
        raise SpecError(f"the measures need at least 4 samples, got {n}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return [b.sort().values for b in order.tensor_split(math.ceil(n / batch_size))]


def measure_banks(
    entry: MeasureEntry, x: Bank, y: Bank, settings: MeasureSettings, seed: int,
    device: torch.device, on_batch: Callable[[], None],
) -> Estimate:
    """One measure between two banks of paired samples (any per-sample shape: flattened)."""
    if x.n != y.n:
        raise ValueError(f"measures need paired samples, got {x.n} and {y.n}")
    xs, ys = [], []
    for idx in partition(x.n, settings.batch_size, seed):
        xs.append(x[idx].flatten(1).to(device, torch.float64))
        ys.append(y[idx].flatten(1).to(device, torch.float64))
        on_batch()
    return entry.estimate(xs, ys, settings, seed)


# ---------------------------------------------------------------- in a job

_NOISE_CENTRES_SEED_OFFSET = 7  # the clustered-noise control's centres (controls.py)
_NOISE_SEED = 13


@dataclass(frozen=True)
class Views:
    """Both models' activations on one set of inputs, paired by sample."""

    front: Bank  # f<=i (the model in front position)
    back: Bank  # g_j
    labels: torch.Tensor
    split: str  # "train" | "test"


@dataclass
class MeasureRun:
    """Collects a job's measure rows stitch pair by stitch pair, reusing what the stitching
    computed; real-input values are symmetric, so they are computed once per pair."""

    rows: list[MeasureRow] = field(default_factory=list)
    controls: list[MeasureRow] = field(default_factory=list)
    _test_acts: dict[tuple[str, str], Bank] = field(default_factory=dict)
    _real: dict[tuple[tuple[str, str], str], tuple[Estimate, float]] = field(
        default_factory=dict)

    def add(self, ctx: JobContext, cut: Cut, test: Split, made: dict[Protocol, Split]) -> None:
        """The measures of one cut: on real test inputs and on the front model's IRIs, with
        the ceiling and the floor."""
        if not ctx.spec.measures:
            return
        real = self._real_views(ctx, cut, test)
        iri = self._iri_views(ctx, cut, made)
        ctx.tracker.enter(f"measures {cut.label}")
        for name in ctx.spec.measures:
            est, seconds = self._real_estimate(ctx, cut, real, name)
            self.rows.append(_row(cut, name, "real", real, est, seconds))
            est, seconds = _timed(ctx, MEASURES[name], iri.front, iri.back)
            self.rows.append(_row(cut, name, "iri", iri, est, seconds))
            self.controls += _control_rows(ctx, cut, name, real, iri)

    def _test_activation(self, ctx: JobContext, where: str, point: str,
                         compute: Callable[[], Bank]) -> Bank:
        key = (where, point)
        if key not in self._test_acts:
            self._test_acts[key] = compute()
        return self._test_acts[key]

    def _real_views(self, ctx: JobContext, cut: Cut, test: Split) -> Views:
        front = self._test_activation(ctx, cut.f.where, cut.i, lambda: test.inputs)

        def back_pass() -> Bank:
            _, feat = ctx.compute(ctx.test_pixels, lambda x: (*cut.g.probe([cut.j])(x),))
            return feat

        back = self._test_activation(ctx, cut.g.where, cut.j, back_pass)
        return Views(front, back, ctx.prep.data.test.labels, "test")

    def _real_estimate(self, ctx: JobContext, cut: Cut, views: Views,
                       name: str) -> tuple[Estimate, float]:
        # Both measures are symmetric and the samples are the same in both directions.
        key = (cut.pair, name)
        if key not in self._real:
            self._real[key] = _timed(ctx, MEASURES[name], views.front, views.back)
        return self._real[key]

    def _iri_views(self, ctx: JobContext, cut: Cut, made: dict[Protocol, Split]) -> Views:
        settings, data = ctx.spec.measure_settings, ctx.prep.data
        reused = made.get("invariance_aware")
        if settings.iri_split == "train" and reused is not None:
            return Views(reused.inputs, reused.back_feats[0], reused.labels, "train")
        if settings.iri_split == "train":
            inputs = InputSet(ctx.train_pixels, data.train.labels, data.digest)
        else:
            inputs = InputSet(ctx.test_pixels, data.test.labels, f"{data.digest}|test-split")
        split, _ = PROTOCOLS["invariance_aware"].train_split(ctx, cut, inputs, [cut.j])
        return Views(split.inputs, split.back_feats[0], split.labels, settings.iri_split)


def _timed(ctx: JobContext, entry: MeasureEntry, x: Bank, y: Bank) -> tuple[Estimate, float]:
    t0 = time.perf_counter()
    est = measure_banks(entry, x, y, ctx.spec.measure_settings, ctx.spec.train.seed,
                        ctx.device, ctx.tracker.step)
    return est, time.perf_counter() - t0


def _row(cut: Cut, name: str, kind: MeasureInput, views: Views, est: Estimate,
         seconds: float, control: Control | None = None,
         sigma: float | None = None) -> MeasureRow:
    return MeasureRow(
        direction=cut.direction, front_layer=cut.pair[0], back_layer=cut.pair[1],
        measure=name, input=kind, value=est.value, ci=est.ci,  # type: ignore[arg-type]
        samples=views.front.n, split=views.split,  # type: ignore[arg-type]
        control=control, sigma=sigma, seconds=seconds,
    )


def _control_rows(ctx: JobContext, cut: Cut, name: str, real: Views,
                  iri: Views) -> list[MeasureRow]:
    """Ceiling: the end model with itself on real inputs (1 by definition: a check of the
    implementation). Floor: the end model against class-clustered noise of its stitch
    point's shape, labels paired by sample: what class clusters alone score."""
    entry, spec = MEASURES[name], ctx.spec
    est, seconds = _timed(ctx, entry, real.back, real.back)
    rows = [_row(cut, name, "real", real, est, seconds, control="identity")]
    shape = cut.g.shapes[cut.j]
    centres = spec.train.seed + _NOISE_CENTRES_SEED_OFFSET
    for kind, views in (("real", real), ("iri", iri)):
        for sigma in spec.control_settings.noise_sigmas:
            noise = ctx.bank(clustered_noise(views.labels, shape, sigma, centres, _NOISE_SEED))
            est, seconds = _timed(ctx, entry, views.back, noise)
            rows.append(_row(cut, name, kind, views, est, seconds,  # type: ignore[arg-type]
                             control="clustered_noise", sigma=sigma))
    return rows


# ---------------------------------------------------------------- cost (progress plan)


def measure_units(spec: Spec, n_train: int, n_test: int, stitches: int) -> int:
    """Work units the measures add to a job of `stitches` (direction, pair) cuts."""
    if not spec.measures:
        return 0
    settings = spec.measure_settings
    n_iri = n_train if settings.iri_split == "train" else n_test
    per_pass = math.ceil(n_test / settings.batch_size) + math.ceil(n_iri / settings.batch_size)
    sigmas = len(spec.control_settings.noise_sigmas)
    # Per cut and measure: real and IRI values, the identity ceiling on real inputs and the
    # floor per sigma on both kinds of input.
    units = stitches * len(spec.measures) * (per_pass * (1 + sigmas)
                                             + math.ceil(n_test / settings.batch_size))
    units += stitches * math.ceil(n_test / EVAL_BATCH)  # g_j on the test split
    if settings.iri_split == "test" or "invariance_aware" not in spec.protocols:
        units += stitches * (iri_units(spec, n_iri) + 2 * math.ceil(n_iri / EVAL_BATCH))
    return units
