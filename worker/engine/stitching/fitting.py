"""Fitting T for one stitch and turning its test logits into a report row."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from stitchsim import catalogue
from stitchsim.models import Control, Objective, Protocol, ResultRow, RobustStats
from stitchsim_worker.engine.job.context import EVAL_BATCH, Cut, JobContext
from stitchsim_worker.engine.measures.metrics import Figures, evaluate, seed_interval
from stitchsim_worker.engine.models.cutting import BackPart
from stitchsim_worker.engine.protocols import PROTOCOLS, stitched
from stitchsim_worker.engine.protocols.attacks import pgd
from stitchsim_worker.engine.stitching.activations import InputSet, Split
from stitchsim_worker.engine.stitching.bank import batches
from stitchsim_worker.engine.stitching.layer import StitchLayer
from stitchsim_worker.engine.stitching.objectives import OBJECTIVES
from stitchsim_worker.engine.stitching.train import Augment, FitTask, stitched_logits


@dataclass
class Fit:
    logits: list[list[torch.Tensor]]  # per seed, per test split
    loss: float  # mean over seeds
    stitch: str  # what T does, in words
    seconds: float
    stitches: list[StitchLayer]  # the fitted T of each seed
    back: BackPart

    def on(self, test: int) -> list[torch.Tensor]:
        """The stitched model's logits on one test split, per seed."""
        return [per_seed[test] for per_seed in self.logits]


def alignment_points(ctx: JobContext, cut: Cut) -> list[str]:
    """The back model's points the objectives need targets at: j, then every later block (or
    stage: spec.fula.points) output when an objective aligns them (fula)."""
    if catalogue.OBJECTIVES.any_of(ctx.spec.objectives, aligns_later_points=True):
        return [cut.j, *cut.g.later_points(cut.j, ctx.spec.fula.points)]
    return [cut.j]


def fit(ctx: JobContext, cut: Cut, objective: Objective, train: Split,
        tests: list[Split], augment: Augment | None = None) -> Fit:
    """Train T for each seed on `train`; evaluate it on each of `tests`."""
    t0 = time.perf_counter()
    entry, settings = OBJECTIVES[objective], ctx.spec.train
    aligns_later = catalogue.OBJECTIVES[objective].aligns_later_points
    later = cut.g.later_points(cut.j, ctx.spec.fula.points) if aligns_later else []
    back = cut.g.back(cut.j, later)
    ctx.tracker.focus(objective=objective)
    logits, losses, stitches = [], [], []
    for s in range(settings.seeds):
        stitch = StitchLayer(cut.f.rep(cut.i), cut.g.rep(cut.j)).to(ctx.device)
        task = FitTask(stitch, back, train, settings, settings.seed + s, ctx.device,
                       ctx.tracker.counter("train"), ctx.tracker.should_cancel, augment)
        losses.append(entry.fit(task))
        stitches.append(stitch)
        logits.append([stitched_logits(stitch, back, t, EVAL_BATCH, ctx.device, ctx.tracker.step)
                       for t in tests])
    ctx.tracker.focus(objective=None)
    return Fit(logits, float(np.mean(losses)), stitches[0].describe(),
               time.perf_counter() - t0, stitches, back)


def robust_stats(ctx: JobContext, cut: Cut, result: Fit, test: Split) -> RobustStats:
    """The stitched and the back model on PGD test inputs crafted against the stitched one
    (cross-entropy against the labels), averaged over seeds."""
    settings, seed = ctx.spec.adversarial, ctx.spec.train.seed
    assert test.pixels is not None
    evals = []
    for stitch in result.stitches:
        h = stitched(cut, stitch, result.back)
        gen = torch.Generator().manual_seed(settings.seed)
        h_out, g_out = [], []
        for idx in batches(len(test), EVAL_BATCH):
            ctx.check_cancel()
            x, y = test.pixels[idx].to(ctx.device), test.labels[idx].to(ctx.device)
            x_adv = pgd(lambda z, y=y, h=h: F.cross_entropy(h(z), y, reduction="sum"), x,
                        settings, gen)
            with torch.no_grad():
                h_out.append(h(x_adv).float().cpu())
                g_out.append(cut.g.logits(x_adv).float().cpu())
            ctx.tracker.step(settings.steps, "attack")
        evals.append(evaluate(torch.cat(h_out), torch.cat(g_out), test.labels, seed=seed))
    values = {k: seed_interval([getattr(e.figures, k) for e in evals])
              for k in ("agreement", "hard_agreement", "accuracy")}
    ci = evals[0].ci["agreement"] if len(evals) == 1 else values["agreement"][1]
    return RobustStats(
        agreement=values["agreement"][0], agreement_ci=ci,
        hard_agreement=values["hard_agreement"][0], accuracy=values["accuracy"][0],
        back_accuracy=float(np.mean([e.back_accuracy for e in evals])),
        epsilon=settings.epsilon, steps=settings.steps,
    )


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
    back_accuracy = evals[0].back_accuracy if test.back_accuracy is None else test.back_accuracy
    return ResultRow(
        direction=cut.direction, front_layer=cut.pair[0], back_layer=cut.pair[1],
        objective=objective, protocol=protocol,
        agreement=values["agreement"], agreement_ci=ci["agreement"],
        hard_agreement=values["hard_agreement"], hard_agreement_ci=ci["hard_agreement"],
        accuracy=values["accuracy"], accuracy_ci=ci["accuracy"],
        stitching_penalty=back_accuracy - values["accuracy"],
        error_consistency=values["error_consistency"],
        error_consistency_ci=ci["error_consistency"],
        correct_agreement=values["correct_agreement"],
        correct_agreement_ci=ci["correct_agreement"],
        soft_kappa=values["soft_kappa"], soft_kappa_ci=ci["soft_kappa"],
        train_loss=result.loss, seconds=result.seconds, stitch=result.stitch, **extra,
    )


def protocol_rows(ctx: JobContext, cut: Cut, inputs: InputSet, tests: list[Split],
                  *, control: Control | None = None, made: dict[Protocol, Split] | None = None,
                  **extra: Any) -> list[list[ResultRow]]:
    """Every protocol and objective for one cut; rows[k] holds each fit evaluated on tests[k]
    (a protocol with a test split of its own is evaluated on that one instead). `made`, when
    given, receives each protocol's training split (the measures read the IRIs' activations
    from it instead of computing them again)."""
    rows: list[list[ResultRow]] = [[] for _ in tests]
    points = alignment_points(ctx, cut)
    robust = ctx.spec.adversarial.evaluate and control is None
    for protocol in ctx.spec.protocols:
        entry = PROTOCOLS[protocol]
        if control is not None and not catalogue.PROTOCOLS[protocol].in_controls:
            continue
        ctx.tracker.focus(point=cut.label, protocol=protocol)
        train, stats = entry.train_split(ctx, cut, inputs, points)
        if made is not None:
            made[protocol] = train
        own = [entry.test_split(ctx, cut)] * len(tests) if entry.test_split else tests
        augment = entry.augment(ctx, cut, points) if entry.augment else None
        ctx.tracker.enter(f"train {cut.label} {protocol}")
        for objective in ctx.spec.objectives:
            result = fit(ctx, cut, objective, train, own, augment)
            attacked = None
            if robust and entry.test_split is None:
                attacked = robust_stats(ctx, cut, result, own[0])
            for k, test in enumerate(own):
                rows[k].append(make_row(ctx, cut, objective, protocol, result.on(k), test,
                                        result, iri=stats, control=control,
                                        robust=attacked if k == 0 else None, **extra))
    return rows


def training_inputs(ctx: JobContext) -> InputSet:
    data = ctx.prep.data
    return InputSet(ctx.train_pixels, data.train.labels, data.digest)
