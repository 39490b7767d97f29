"""Representation similarity measures beside stitching (issue 14), one registered entry each.

A measure compares the two models' activations at one stitch pair on the same inputs, with
nothing fitted: on the test split's real images, and on the front model's IRIs (both models'
activations on them), which is what makes it invariance-aware. The activations are the ones
the job already computes: f<=i on the test split (the test split of the stitch), f<=i and
g_j on IRIs (the invariance-aware protocol's training split, subsampled to the test split's
size); only g_j on the test split is one extra pass per stitch pair. Without that protocol,
or with `iri_split: "test"`, the IRIs are made through the protocol's own entry (same cache).

Every measure works on mini-batches of a fixed, seeded partition of the samples, so memory
stays bounded on large test sets, and reports a 95% bootstrap interval over samples. Adding a
measure is one `register_measure` call plus its name in the contract's `Measure`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
from stitchsim_worker.engine.costs import Sizes, passes
from stitchsim_worker.engine.data import clustered_noise
from stitchsim_worker.engine.errors import SpecError
from stitchsim_worker.engine.metrics import BOOTSTRAP_RESAMPLES
from stitchsim_worker.engine.progress import Units
from stitchsim_worker.engine.protocols import PROTOCOLS, iri_units
from stitchsim_worker.engine.registry import Registry
from stitchsim_worker.engine.splits import InputSet, Split

_QUANTILES = (0.025, 0.975)


@dataclass(frozen=True)
class Estimate:
    value: float
    ci: tuple[float, float]


@dataclass(frozen=True)
class Batching:
    """A seeded shuffle of n samples cut into near-equal mini-batches, and per batch the
    bootstrap's resampling multiplicities (R, m): the same for every measure and every pair
    of representations of a job, so each representation is prepared once."""

    batches: list[torch.Tensor]
    weights: list[torch.Tensor]


@dataclass(frozen=True)
class MeasureEntry:
    name: Measure
    label: str
    description: str
    prepare: Callable[[torch.Tensor, torch.Tensor, MeasureSettings], Any]
    """(one mini-batch of one representation, flattened, float64; its resampling weights;
    settings) -> what comparisons with another representation need."""
    compare: Callable[[list[Any], list[Any], MeasureSettings], tuple[float, torch.Tensor]]
    """(prepared batches of X, of Y) -> the value and its bootstrap distribution."""


MEASURES: Registry[MeasureEntry] = Registry("measure")
register_measure = MEASURES.register


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


@dataclass(frozen=True)
class GramBatch:
    """One representation's kernel on one mini-batch, with what every bootstrap resample of
    it needs (K w and w'Kw per resample) and its own HSIC(K, K). The point estimate is in
    float64; the resamples only place an interval, so they run in float32 (half the time)."""

    k: torch.Tensor
    k32: torch.Tensor
    w: torch.Tensor  # float32 multiplicities (exact: small integers)
    kw: torch.Tensor
    wkw: torch.Tensor
    own: torch.Tensor | None = None  # hsic1(K, K)
    own_boot: torch.Tensor | None = None  # (R,)

    @classmethod
    def of(cls, k: torch.Tensor, w: torch.Tensor, own: bool = True) -> GramBatch:
        k32 = k.float()
        kw = w @ k32
        part = cls(k, k32, w, kw, (kw * w).sum(-1))
        if not own:
            return part
        return cls(k, k32, w, kw, part.wkw, hsic1(k, k), _resampled_hsic(part, part))


def _resampled_hsic(a: GramBatch, b: GramBatch) -> torch.Tensor:
    """hsic1 of the batch resampled with multiplicities w (R, n): a sample drawn twice is no
    pair of distinct samples, so its copies meet only through K's zero diagonal, and every
    term of the estimator is a quadratic or cubic form in w (no resampled matrix is built)."""
    n, w = a.k.shape[-1], a.w
    trace = (w @ (a.k32 * b.k32) * w).sum(-1)
    total = a.wkw * b.wkw / ((n - 1) * (n - 2))
    cross = (w * a.kw * b.kw).sum(-1)
    return ((trace + total - 2.0 * cross / (n - 2)) / (n * (n - 3))).double()


def weighted_hsic1(k: torch.Tensor, lk: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """hsic1 of K and L on the resamples w (what the bootstrap computes)."""
    w = w.float()
    return _resampled_hsic(GramBatch.of(k, w, own=False), GramBatch.of(lk, w, own=False))


def cka_from_sums(xy: torch.Tensor, xx: torch.Tensor, yy: torch.Tensor) -> torch.Tensor:
    """Mini-batch CKA (Nguyen et al. 2021): sum of HSIC(X,Y) over batches over the geometric
    mean of the sums of HSIC(X,X) and HSIC(Y,Y)."""
    return xy / (xx * yy).clamp_min(1e-300).sqrt()


def _cka_prepare(x: torch.Tensor, w: torch.Tensor, _settings: MeasureSettings) -> GramBatch:
    return GramBatch.of(gram(x), w)


def _cka_compare(xs: list[GramBatch], ys: list[GramBatch], _settings: MeasureSettings
                 ) -> tuple[float, torch.Tensor]:
    xy = sum(hsic1(a.k, b.k) for a, b in zip(xs, ys, strict=True))
    xx, yy = sum(a.own for a in xs), sum(b.own for b in ys)  # type: ignore[misc]
    # Resampled within each batch: the estimator is built batch by batch.
    boot_xy = sum(_resampled_hsic(a, b) for a, b in zip(xs, ys, strict=True))
    boot_xx = sum(a.own_boot for a in xs)  # type: ignore[misc]
    boot_yy = sum(b.own_boot for b in ys)  # type: ignore[misc]
    return float(cka_from_sums(xy, xx, yy)), cka_from_sums(boot_xy, boot_xx, boot_yy)


register_measure(MeasureEntry(
    name="cka", label="linear CKA",
    description="linear centred kernel alignment, unbiased HSIC accumulated over mini-batches "
    "(as in the invariance-aware paper's code); 1 for representations equal up to rotation "
    "and scale",
    prepare=_cka_prepare, compare=_cka_compare,
))


# ---------------------------------------------------------------- mutual k-NN


@dataclass(frozen=True)
class Neighbours:
    idx: torch.Tensor  # (m, k) nearest neighbours of each sample in its batch
    w: torch.Tensor


def nearest(z: torch.Tensor, k: int) -> torch.Tensor:
    """Each row's k nearest rows by cosine similarity, itself excluded."""
    if len(z) <= k:
        raise SpecError(
            f"mutual_knn needs more than knn_k={k} samples per mini-batch, but a batch holds "
            f"{len(z)}; lower measure_settings.knn_k or use more test samples"
        )
    zn = torch.nn.functional.normalize(z, dim=1)
    sim = zn @ zn.T
    sim.fill_diagonal_(-math.inf)
    return sim.topk(k, dim=1).indices


def knn_overlap(x: torch.Tensor, y: torch.Tensor, k: int) -> torch.Tensor:
    """Per sample: the share of its k nearest neighbours (cosine, itself excluded) that the
    two representations have in common (Huh et al. 2024, the platonic representation)."""
    return _overlap(nearest(x, k), nearest(y, k))


def _overlap(nx: torch.Tensor, ny: torch.Tensor) -> torch.Tensor:
    common = (nx[:, :, None] == ny[:, None, :]).any(-1).sum(-1)
    return common.double() / nx.shape[1]


def _knn_prepare(x: torch.Tensor, w: torch.Tensor, settings: MeasureSettings) -> Neighbours:
    return Neighbours(nearest(x, settings.knn_k), w)


def _knn_compare(xs: list[Neighbours], ys: list[Neighbours], _settings: MeasureSettings
                 ) -> tuple[float, torch.Tensor]:
    # Neighbourhoods are fixed by the batches; the resampling is over per-sample scores.
    scores = [_overlap(a.idx, b.idx) for a, b in zip(xs, ys, strict=True)]
    n = sum(len(s) for s in scores)
    boot = sum(a.w.double() @ s for a, s in zip(xs, scores, strict=True)) / n
    return float(torch.cat(scores).mean()), boot


register_measure(MeasureEntry(
    name="mutual_knn", label="mutual k-NN alignment",
    description="mean share of each sample's k nearest neighbours (cosine, within its "
    "mini-batch) that both representations agree on; 1 when the neighbourhoods match",
    prepare=_knn_prepare, compare=_knn_compare,
))


# ---------------------------------------------------------------- on tensors and banks


def batching(n: int, batch_size: int, seed: int, device: torch.device) -> Batching:
    """The partition (no runt batch: the unbiased HSIC needs 4 samples, k-NN more than k; a
    shuffle, so class-sorted data mixes) and the bootstrap multiplicities per batch."""
    if n < 4:
        raise SpecError(f"the measures need at least 4 samples, got {n}")
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=gen)
    batches = [b.sort().values for b in order.tensor_split(math.ceil(n / batch_size))]
    weights = []
    for b in batches:
        m = len(b)
        idx = torch.randint(0, m, (BOOTSTRAP_RESAMPLES, m), generator=gen)
        w = torch.zeros(BOOTSTRAP_RESAMPLES, m, dtype=torch.float32)
        weights.append(w.scatter_add_(1, idx, torch.ones_like(w)).to(device))
    return Batching(batches, weights)


def partition(n: int, batch_size: int, seed: int) -> list[torch.Tensor]:
    return batching(n, batch_size, seed, torch.device("cpu")).batches


Source = Bank | torch.Tensor  # per-sample rows of any shape, indexable by sample indices


def prepare(entry: MeasureEntry, x: Source, plan: Batching, settings: MeasureSettings,
            device: torch.device, on_batch: Callable[[], None] | None = None) -> list[Any]:
    out = []
    for idx, w in zip(plan.batches, plan.weights, strict=True):
        out.append(entry.prepare(x[idx].flatten(1).to(device, torch.float64), w, settings))
        if on_batch is not None:
            on_batch()
    return out


def estimate(entry: MeasureEntry, px: list[Any], py: list[Any],
             settings: MeasureSettings) -> Estimate:
    value, boot = entry.compare(px, py, settings)
    return Estimate(value, _interval(boot))


def _interval(dist: torch.Tensor) -> tuple[float, float]:
    q = torch.quantile(dist.double().cpu(), torch.tensor(_QUANTILES, dtype=torch.float64))
    return float(q[0]), float(q[1])


def measure(name: str, x: Source, y: Source, settings: MeasureSettings, seed: int,
            device: torch.device = torch.device("cpu")) -> Estimate:
    """One measure between two sets of paired samples (flattened per sample)."""
    if len(x) != len(y):
        raise ValueError(f"measures need paired samples, got {len(x)} and {len(y)}")
    entry, plan = MEASURES[name], batching(len(x), settings.batch_size, seed, device)
    return estimate(entry, prepare(entry, x, plan, settings, device),
                    prepare(entry, y, plan, settings, device), settings)


# ---------------------------------------------------------------- in a job

_NOISE_CENTRES_SEED_OFFSET = 7  # the clustered-noise control's centres (controls.py)
_NOISE_SEED = 13


@dataclass(frozen=True)
class Views:
    """Both models' activations on one set of inputs, paired by sample."""

    front: Source  # f<=i (the model in front position)
    back: Source  # g_j
    labels: torch.Tensor
    split: str  # "train" | "test"


class _Prepared:
    """Each representation of one cut prepared once per measure (its kernel, its
    neighbours), then compared with as many others as the rows and controls need."""

    def __init__(self, ctx: JobContext, plans: dict[int, Batching]):
        self.ctx, self.plans = ctx, plans
        self._done: dict[tuple[str, int], tuple[Source, list[Any]]] = {}

    def plan(self, n: int) -> Batching:
        if n not in self.plans:
            settings = self.ctx.spec.measure_settings
            self.plans[n] = batching(n, settings.batch_size, self.ctx.spec.train.seed,
                                     self.ctx.device)
        return self.plans[n]

    def of(self, name: str, x: Source) -> list[Any]:
        key = (name, id(x))  # the source is kept with its entry, so its id stays unique
        if key not in self._done:
            prepared = prepare(MEASURES[name], x, self.plan(len(x)),
                               self.ctx.spec.measure_settings, self.ctx.device,
                               self.ctx.tracker.counter("measure"))
            self._done[key] = (x, prepared)
        return self._done[key][1]

    def estimate(self, name: str, x: Source, y: Source) -> tuple[Estimate, float]:
        t0 = time.perf_counter()
        self.ctx.check_cancel()
        est = estimate(MEASURES[name], self.of(name, x), self.of(name, y),
                       self.ctx.spec.measure_settings)
        return est, time.perf_counter() - t0


@dataclass
class MeasureRun:
    """Collects a job's measure rows stitch pair by stitch pair, reusing what the stitching
    computed; real-input values are symmetric, so they are computed once per pair."""

    rows: list[MeasureRow] = field(default_factory=list)
    controls: list[MeasureRow] = field(default_factory=list)
    _test_acts: dict[tuple[str, str], Bank] = field(default_factory=dict)
    _real: dict[tuple[tuple[str, str], str], tuple[Estimate, float]] = field(
        default_factory=dict)
    _plans: dict[int, Batching] = field(default_factory=dict)

    def add(self, ctx: JobContext, cut: Cut, test: Split, made: dict[Protocol, Split]) -> None:
        """The measures of one cut: on real test inputs and on the front model's IRIs, with
        the ceiling and the floor."""
        if not ctx.spec.measures:
            return
        # The stage covers g_j's pass over the test split; IRIs made here have their own.
        ctx.tracker.enter(f"measures {cut.label}")
        real = self._real_views(ctx, cut, test)
        iri = self._iri_views(ctx, cut, made)
        ctx.tracker.enter(f"measures {cut.label}")
        prepared = _Prepared(ctx, self._plans)
        noise = _noise(ctx, cut, (real, iri))
        for name in ctx.spec.measures:
            # Both measures are symmetric, and the real samples are the same in both
            # directions: the second direction reuses the first one's figure.
            key = (cut.pair, name)
            if key not in self._real:
                self._real[key] = prepared.estimate(name, real.front, real.back)
            self.rows.append(_row(cut, name, "real", real, *self._real[key]))
            self.rows.append(_row(cut, name, "iri", iri,
                                  *prepared.estimate(name, iri.front, iri.back)))
            self.controls += _control_rows(prepared, cut, name, real, iri, noise)

    def _test_activation(self, where: str, point: str, compute: Callable[[], Bank]) -> Bank:
        key = (where, point)
        if key not in self._test_acts:
            self._test_acts[key] = compute()
        return self._test_acts[key]

    def _real_views(self, ctx: JobContext, cut: Cut, test: Split) -> Views:
        front = self._test_activation(cut.f.where, cut.i, lambda: test.inputs)

        def back_pass() -> Bank:
            _, feat = ctx.compute(ctx.test_pixels, lambda x: (*cut.g.probe([cut.j])(x),))
            return feat

        back = self._test_activation(cut.g.where, cut.j, back_pass)
        return Views(front, back, ctx.prep.data.test.labels, "test")

    def _iri_views(self, ctx: JobContext, cut: Cut, made: dict[Protocol, Split]) -> Views:
        settings, data = ctx.spec.measure_settings, ctx.prep.data
        split = made.get("invariance_aware")
        if settings.iri_split == "test":
            inputs = InputSet(ctx.test_pixels, data.test.labels, f"{data.digest}|test-split")
            split, _ = PROTOCOLS["invariance_aware"].train_split(ctx, cut, inputs, [cut.j])
        elif split is None:  # no invariance-aware stitching: the same IRIs it would make
            inputs = InputSet(ctx.train_pixels, data.train.labels, data.digest)
            split, _ = PROTOCOLS["invariance_aware"].train_split(ctx, cut, inputs, [cut.j])
        # As many IRIs as real test samples, so both kinds of input are cut into batches of
        # the same size (k-NN's chance level is k / (batch - 1)) and cost the same.
        pick = _subset(len(split), ctx.test_pixels.n, ctx.spec.train.seed)
        return Views(split.inputs[pick], split.back_feats[0][pick], split.labels[pick],
                     settings.iri_split)


def _subset(n: int, size: int, seed: int) -> torch.Tensor:
    """A seeded choice of min(n, size) of n samples, in order."""
    if n <= size:
        return torch.arange(n)
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:size].sort().values


def _row(cut: Cut, name: str, kind: MeasureInput, views: Views, est: Estimate,
         seconds: float, control: Control | None = None,
         sigma: float | None = None) -> MeasureRow:
    return MeasureRow(
        direction=cut.direction, front_layer=cut.pair[0], back_layer=cut.pair[1],
        measure=name, input=kind, value=est.value, ci=est.ci,  # type: ignore[arg-type]
        samples=len(views.front), split=views.split,  # type: ignore[arg-type]
        control=control, sigma=sigma, seconds=seconds,
    )


def _noise(ctx: JobContext, cut: Cut, views: tuple[Views, Views]
           ) -> dict[tuple[int, float], torch.Tensor]:
    """Class-clustered noise of the end model's stitch point shape, per input kind and sigma,
    labelled like the samples it stands beside (shared by every measure of the cut)."""
    spec, shape = ctx.spec, cut.g.shapes[cut.j]
    centres = spec.train.seed + _NOISE_CENTRES_SEED_OFFSET
    return {
        (k, sigma): clustered_noise(v.labels, shape, sigma, centres, _NOISE_SEED)
        for k, v in enumerate(views) for sigma in spec.control_settings.noise_sigmas
    }


def _control_rows(prepared: _Prepared, cut: Cut, name: str, real: Views, iri: Views,
                  noise: dict[tuple[int, float], torch.Tensor]) -> list[MeasureRow]:
    """Ceiling: the end model with itself on real inputs (1 by definition: a check of the
    implementation). Floor: the end model against class-clustered noise of its stitch
    point's shape, labels paired by sample: what class clusters alone score."""
    rows = [_row(cut, name, "real", real, *prepared.estimate(name, real.back, real.back),
                 control="identity")]
    for (k, sigma), z in noise.items():
        kind, views = (("real", real), ("iri", iri))[k]
        rows.append(_row(cut, name, kind, views,  # type: ignore[arg-type]
                         *prepared.estimate(name, views.back, z),
                         control="clustered_noise", sigma=sigma))
    return rows


# ---------------------------------------------------------------- cost (progress plan)


def measure_units(spec: Spec, sizes: Sizes, directions: int) -> Units:
    """Work units the measures add to a job (MeasureRun.add at every cut)."""
    if not spec.measures:
        return Units()
    settings = spec.measure_settings
    n_iri = sizes.train if settings.iri_split == "train" else sizes.test
    real = passes(sizes.test, settings.batch_size)
    iri = passes(min(n_iri, sizes.test), settings.batch_size)  # as many IRIs as test samples
    floor = len(spec.control_settings.noise_sigmas) * (real + iri)
    # Per measure, one unit per mini-batch of each representation prepared: both models on
    # real inputs and on IRIs, and the floor's noise beside each; the second direction reuses
    # the real figure, so it prepares the real inputs of the end model only.
    first, again = 2 * real + 2 * iri + floor, real + 2 * iri + floor
    per_pair = Units(measure=len(spec.measures) * (first + again * (directions - 1)),
                     forward=passes(sizes.test, EVAL_BATCH))  # g_j, kept for both directions
    units = per_pair * sizes.pairs
    if settings.iri_split == "test" or "invariance_aware" not in spec.protocols:
        own_iris = Units(forward=2 * passes(n_iri, EVAL_BATCH), iri=iri_units(spec, n_iri))
        units += own_iris * (directions * sizes.pairs)
    return units
