"""Representation similarity measures beside stitching, one registered entry each.

A measure compares the two models' activations at one stitch pair on the same inputs, with
nothing fitted: on the test split's real images, and on the front model's IRIs (both models'
activations on them), which is what makes it invariance-aware. The activations are the ones
the job already computes: f<=i on the test split (the test split of the stitch), f<=i and
g_j on IRIs (the invariance-aware protocol's training split, subsampled to the test split's
size); only g_j on the test split is one extra pass per stitch pair. Without that protocol,
or with `iri_split: "test"`, the IRIs are made through the protocol's own entry (same cache).

Every measure works on mini-batches of a fixed, seeded partition of the samples, so memory
stays bounded on large test sets, and reports a 95% bootstrap interval over samples. What a
measure is called is its catalogue entry's (stitchsim.catalogue.MEASURES); adding a measure
is its catalogue entry plus one `register_measure` call (in a module imported by this
package's __init__, or by a plug-in), under the same name: the job, the report, the page and
the table take it from there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from stitchsim.failure import Failure
from stitchsim.models import (
    Measure,
    MeasureSettings,
)
from stitchsim_worker.engine.core.bank import Bank
from stitchsim_worker.engine.core.registry import Registry
from stitchsim_worker.engine.measures.metrics import BOOTSTRAP_RESAMPLES

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
class MeasureImpl:
    name: Measure
    prepare: Callable[[torch.Tensor, torch.Tensor, MeasureSettings], Any]
    """(one mini-batch of one representation, flattened, float64; its resampling weights;
    settings) -> what comparisons with another representation need."""
    compare: Callable[[list[Any], list[Any], MeasureSettings], tuple[float, torch.Tensor]]
    """(prepared batches of X, of Y) -> the value and its bootstrap distribution."""


MEASURE_IMPLS: Registry[MeasureImpl] = Registry("measure")
register_measure = MEASURE_IMPLS.register


def batching(n: int, batch_size: int, seed: int, device: torch.device) -> Batching:
    """The partition (no runt batch: the unbiased HSIC needs 4 samples, k-NN more than k; a
    shuffle, so class-sorted data mixes) and the bootstrap multiplicities per batch."""
    if n < 4:
        raise Failure("invalid_spec", f"the measures need at least 4 samples, got {n}")
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


Source = Bank | torch.Tensor  # per-sample rows of any shape, indexable by sample indices


def prepare(entry: MeasureImpl, x: Source, plan: Batching, settings: MeasureSettings,
            device: torch.device, on_batch: Callable[[], None] | None = None) -> list[Any]:
    out = []
    for idx, w in zip(plan.batches, plan.weights, strict=True):
        out.append(entry.prepare(x[idx].flatten(1).to(device, torch.float64), w, settings))
        if on_batch is not None:
            on_batch()
    return out


def estimate(entry: MeasureImpl, px: list[Any], py: list[Any],
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
    entry, plan = MEASURE_IMPLS[name], batching(len(x), settings.batch_size, seed, device)
    return estimate(entry, prepare(entry, x, plan, settings, device),
                    prepare(entry, y, plan, settings, device), settings)
