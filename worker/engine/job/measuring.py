"""The measures in a job: on the activations the stitching computed, with their controls,
as steps of the job (after each cut's comparison: its views, then one a measure), each with
its work units beside its run."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from stitchsim import catalogue
from stitchsim.models import (
    Control,
    Direction,
    MeasureInput,
    MeasureRow,
    Protocol,
    Spec,
)
from stitchsim_worker.engine.core.bank import Bank
from stitchsim_worker.engine.core.context import (
    EVAL_BATCH,
    Cut,
    JobContext,
    cut_label,
    front_point,
)
from stitchsim_worker.engine.core.costs import Sizes, passes
from stitchsim_worker.engine.core.progress import Units
from stitchsim_worker.engine.core.step import JobRun, Pair, Step
from stitchsim_worker.engine.data.datasets import clustered_noise
from stitchsim_worker.engine.measures.similarity import (
    MEASURE_IMPLS,
    Batching,
    Estimate,
    Source,
    batching,
    estimate,
    prepare,
)
from stitchsim_worker.engine.protocols import PROTOCOL_IMPLS
from stitchsim_worker.engine.protocols.entry import TrainSplitFn
from stitchsim_worker.engine.protocols.invariance_aware import iri_stage
from stitchsim_worker.engine.stitching.activations import InputSet, Split

_NOISE_CENTRES_SEED_OFFSET = 7  # the clustered-noise control's centres (controls.py)
_NOISE_SEED = 13
"""The protocol whose entry makes the IRIs the measures read."""


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
            prepared = prepare(MEASURE_IMPLS[name], x, self.plan(len(x)),
                               self.ctx.spec.measure_settings, self.ctx.device,
                               self.ctx.tracker.counter("measure"))
            self._done[key] = (x, prepared)
        return self._done[key][1]

    def estimate(self, name: str, x: Source, y: Source) -> tuple[Estimate, float]:
        t0 = time.perf_counter()
        self.ctx.check_cancel()
        est = estimate(MEASURE_IMPLS[name], self.of(name, x), self.of(name, y),
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
    plans: dict[int, Batching] = field(default_factory=dict)
    """The measures' batch plans by number of samples, shared by every cut."""

    def measure(self, at: _AtMeasures, name: str) -> None:
        """One measure of one cut, with the ceiling and the floor."""
        assert at.cut is not None and at.prepared is not None
        cut, prepared, real, iri = at.cut, at.prepared, at.real, at.iri
        # Both measures are symmetric, and the real samples are the same in both
        # directions: the second direction reuses the first one's figure.
        key = (cut.pair, name)
        if key not in self._real:
            self._real[key] = prepared.estimate(name, real.front, real.back)
        self.rows.append(_row(cut, name, "real", real, *self._real[key]))
        self.rows.append(_row(cut, name, "iri", iri,
                              *prepared.estimate(name, iri.front, iri.back)))
        self.controls += _control_rows(prepared, cut, name, real, iri, at.noise)

    def _test_activation(self, where: str, point: str, compute: Callable[[], Bank]) -> Bank:
        key = (where, point)
        if key not in self._test_acts:
            self._test_acts[key] = compute()
        return self._test_acts[key]

    def real_views(self, ctx: JobContext, cut: Cut, test: Split) -> Views:
        front = self._test_activation(cut.f.where, cut.i, lambda: test.inputs)

        def back_pass() -> Bank:
            _, feat = ctx.compute(ctx.test_pixels, lambda x: (*cut.g.probe([cut.j])(x),))
            return feat

        back = self._test_activation(cut.g.where, cut.j, back_pass)
        return Views(front, back, ctx.prep.data.test.labels, "test")

    def iri_views(self, ctx: JobContext, cut: Cut, made: dict[Protocol, Split],
                  iris: TrainSplitFn) -> Views:
        """The IRIs the IRI protocol made, or these `iris` makes (on the test split, or on
        the training split when no IRI stitching ran)."""
        settings, data = ctx.spec.measure_settings, ctx.prep.data
        split = made.get(catalogue.IRI_PROTOCOL)
        if settings.iri_split == "test":
            inputs = InputSet(ctx.test_pixels, data.test.labels, f"{data.digest}|test-split")
            split, _ = iris(ctx, cut, inputs, [cut.j])
        elif split is None:  # no IRI stitching ran: the same IRIs it would make
            inputs = InputSet(ctx.train_pixels, data.train.labels, data.digest)
            split, _ = iris(ctx, cut, inputs, [cut.j])
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


@dataclass
class _AtMeasures:
    """What one cut's measure steps share: its views and their noise, made by its first."""

    cut: Cut | None = None
    real: Views = field(init=False)
    iri: Views = field(init=False)
    noise: dict[tuple[int, float], torch.Tensor] = field(default_factory=dict)
    prepared: _Prepared | None = None


def measure_steps(spec: Spec, sizes: Sizes, direction: Direction, pair: Pair,
                  first_direction: bool) -> list[Step]:
    """The measures of one cut, after its comparison: a step for the activations on real
    test inputs and on the front model's IRIs, then one per measure (on both, with the
    ceiling and the floor), in the stage `measures ...`; IRIs made here are a step of their
    own, in their stage."""
    stage, at = f"measures {cut_label(direction, pair)}", _AtMeasures()
    settings = spec.measure_settings
    n_iri = sizes.train if settings.iri_split == "train" else sizes.test
    # g_j's pass over the test split is kept for both directions: the first one makes it.
    real_units = Units(forward=passes(sizes.test, EVAL_BATCH)) if first_direction else Units()
    makes_iris = settings.iri_split == "test" or catalogue.IRI_PROTOCOL not in spec.protocols
    iris = PROTOCOL_IMPLS[catalogue.IRI_PROTOCOL].train_split(spec, n_iri)
    made: dict[Protocol, Split] = {}

    def real_views(job: JobRun) -> None:
        test, protocols_made = job.splits.pop((direction, pair))
        made.update(protocols_made)
        at.cut = job.ctx.cut(direction, pair)
        at.real = job.measured.real_views(job.ctx, at.cut, test)

    def iri_views(job: JobRun) -> None:
        assert at.cut is not None
        at.iri = job.measured.iri_views(job.ctx, at.cut, made, iris.run)
        made.clear()
        at.noise = _noise(job.ctx, at.cut, (at.real, at.iri))
        at.prepared = _Prepared(job.ctx, job.measured.plans)

    real = passes(sizes.test, settings.batch_size)
    iri = passes(min(n_iri, sizes.test), settings.batch_size)  # as many IRIs as test samples
    floor = len(spec.control_settings.noise_sigmas) * (real + iri)
    # Both models on real inputs and on IRIs, and the floor's noise beside each; the second
    # direction reuses the real figure, so it prepares the real inputs of the end model only.
    per_measure = Units(measure=(2 if first_direction else 1) * real + 2 * iri + floor)
    steps = [Step(stage, real_units, real_views)]
    if makes_iris:
        steps.append(Step(iri_stage(*front_point(direction, pair)), iris.units, iri_views,
                          "measures"))
    else:  # the IRIs the protocols made, in the stage before
        steps.append(Step(None, Units(), iri_views, "measures"))
    for n, name in enumerate(spec.measures):
        # The first enters the stage again: the IRIs made for the views had one of their own.
        steps.append(Step(None if n else stage, per_measure, _measure(at, name), "measures"))
    return steps


def _measure(at: _AtMeasures, name: str) -> Callable[[JobRun], None]:
    def run(job: JobRun) -> None:
        job.measured.measure(at, name)

    return run
