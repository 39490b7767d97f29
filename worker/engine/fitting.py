"""Fitting T for one stitch and turning its test logits into a report row."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from stitchsim.models import Objective, Protocol, ResultRow
from stitchsim_worker.engine.context import EVAL_BATCH, Cut, JobContext
from stitchsim_worker.engine.metrics import Figures, evaluate, seed_interval
from stitchsim_worker.engine.objectives import OBJECTIVES
from stitchsim_worker.engine.protocols import PROTOCOLS
from stitchsim_worker.engine.splits import InputSet, Split
from stitchsim_worker.engine.stitch import StitchLayer
from stitchsim_worker.engine.train import FitTask, stitched_logits


@dataclass
class Fit:
    logits: list[list[torch.Tensor]]  # per seed, per test split
    loss: float  # mean over seeds
    stitch: str  # what T does, in words
    seconds: float

    def on(self, test: int) -> list[torch.Tensor]:
        """The stitched model's logits on one test split, per seed."""
        return [per_seed[test] for per_seed in self.logits]


def alignment_points(ctx: JobContext, cut: Cut) -> list[str]:
    """The back model's points the objectives need targets at: j, then every later stage when
    an objective aligns them (fula)."""
    if any(OBJECTIVES[o].aligns_later_points for o in ctx.spec.objectives):
        return [cut.j, *cut.g.later_stages(cut.j)]
    return [cut.j]


def fit(ctx: JobContext, cut: Cut, objective: Objective, train: Split,
        tests: list[Split]) -> Fit:
    """Train T for each seed on `train`; evaluate it on each of `tests`."""
    t0 = time.perf_counter()
    entry, settings = OBJECTIVES[objective], ctx.spec.train
    later = cut.g.later_stages(cut.j) if entry.aligns_later_points else []
    back = cut.g.back(cut.j, later)
    ctx.tracker.focus(objective=objective)
    logits, losses, description = [], [], ""
    for s in range(settings.seeds):
        stitch = StitchLayer(cut.f.rep(cut.i), cut.g.rep(cut.j)).to(ctx.device)
        description = stitch.describe()
        task = FitTask(stitch, back, train, settings, settings.seed + s, ctx.device,
                       ctx.tracker.step, ctx.tracker.should_cancel)
        losses.append(entry.fit(task))
        logits.append([stitched_logits(stitch, back, t, EVAL_BATCH, ctx.device) for t in tests])
    ctx.tracker.focus(objective=None)
    return Fit(logits, float(np.mean(losses)), description, time.perf_counter() - t0)


def make_row(ctx: JobContext, cut: Cut, objective: Objective, protocol: Protocol,
             h_logits: list[torch.Tensor], test: Split, result: Fit, **extra: Any) -> ResultRow:
    """The figures of one stitched model against the back model on one test split."""
    g_logits, seed = test.back_logits.all(), ctx.spec.train.seed
    evals = [evaluate(h, g_logits, test.labels, seed=seed) for h in h_logits]
    if len(evals) == 1:
        values = {k: getattr(evals[0].figures, k) for k in Figures.names()}
        ci = evals[0].ci
    else:  # several seeds: the interval is over seeds
        values, ci = {}, {}
        for k in Figures.names():
            values[k], ci[k] = seed_interval([getattr(e.figures, k) for e in evals])
    return ResultRow(
        direction=cut.direction, front_layer=cut.pair[0], back_layer=cut.pair[1],
        objective=objective, protocol=protocol,
        agreement=values["agreement"], agreement_ci=ci["agreement"],
        hard_agreement=values["hard_agreement"], hard_agreement_ci=ci["hard_agreement"],
        accuracy=values["accuracy"], accuracy_ci=ci["accuracy"],
        stitching_penalty=evals[0].back_accuracy - values["accuracy"],
        error_consistency=values["error_consistency"],
        error_consistency_ci=ci["error_consistency"],
        train_loss=result.loss, seconds=result.seconds, stitch=result.stitch, **extra,
    )


def protocol_rows(ctx: JobContext, cut: Cut, inputs: InputSet, tests: list[Split],
                  **extra: Any) -> list[list[ResultRow]]:
    """Every protocol and objective for one cut; rows[k] holds each fit evaluated on tests[k]."""
    rows: list[list[ResultRow]] = [[] for _ in tests]
    points = alignment_points(ctx, cut)
    for protocol in ctx.spec.protocols:
        ctx.tracker.focus(point=cut.label, protocol=protocol)
        train, stats = PROTOCOLS[protocol].train_split(ctx, cut, inputs, points)
        ctx.tracker.enter(f"train {cut.label} {protocol}")
        for objective in ctx.spec.objectives:
            result = fit(ctx, cut, objective, train, tests)
            for k, test in enumerate(tests):
                rows[k].append(make_row(ctx, cut, objective, protocol, result.on(k), test,
                                        result, iri=stats, **extra))
    return rows


def training_inputs(ctx: JobContext) -> InputSet:
    data = ctx.prep.data
    return InputSet(ctx.train_pixels, data.train.labels, data.digest)
