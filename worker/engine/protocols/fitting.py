"""Fitting T for one stitch and turning its test logits into a report row."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from stitchsim import catalogue
from stitchsim.models import Control, Objective, Protocol, ResultRow, RobustStats, Spec
from stitchsim_worker.engine.core.bank import batches
from stitchsim_worker.engine.core.context import EVAL_BATCH, Cut, JobContext
from stitchsim_worker.engine.core.costs import Sizes, passes
from stitchsim_worker.engine.core.progress import Units
from stitchsim_worker.engine.measures.metrics import evaluate, seed_interval
from stitchsim_worker.engine.measures.outputs import OUTPUTS, Scored
from stitchsim_worker.engine.models.attacks import ATTACK_IMPLS, attack_passes
from stitchsim_worker.engine.models.cutting import BackPart
from stitchsim_worker.engine.protocols import PROTOCOL_IMPLS, stitched
from stitchsim_worker.engine.stitching.activations import InputSet, Split
from stitchsim_worker.engine.stitching.grids import image_grid
from stitchsim_worker.engine.stitching.layer import StitchLayer
from stitchsim_worker.engine.stitching.objectives import OBJECTIVE_IMPLS
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
    entry, settings = OBJECTIVE_IMPLS[objective], ctx.spec.train
    aligns_later = catalogue.OBJECTIVES[objective].aligns_later_points
    later = cut.g.later_points(cut.j, ctx.spec.fula.points) if aligns_later else []
    back = cut.g.back(cut.j, later)
    ctx.tracker.focus(objective=objective)
    logits, losses, stitches = [], [], []
    for s in range(settings.seeds):
        stitch = StitchLayer(cut.f.rep(cut.i), cut.g.rep(cut.j)).to(ctx.device)
        task = FitTask(stitch, back, train, settings, settings.seed + s, ctx.device,
                       ctx.tracker.counter("train"), ctx.tracker.should_cancel, augment,
                       output=cut.g.output)
        losses.append(entry.fit(task))
        stitches.append(stitch)
        logits.append([stitched_logits(stitch, back, t, EVAL_BATCH, ctx.device, ctx.tracker.step)
                       for t in tests])
    ctx.tracker.focus(objective=None)
    return Fit(logits, float(np.mean(losses)), stitches[0].describe(),
               time.perf_counter() - t0, stitches, back)


def fit_units(spec: Spec, n_train: int, tests: Sequence[int], *, augmented: bool = False,
              robust: bool = False) -> Units:
    """fit() for every objective of the spec on n_train inputs, its stitched model run on each
    test split; an augmented fit crafts PGD inputs in every training batch, and a robust one
    is then attacked on the first test split (robust_stats)."""
    adv = spec.adversarial.steps
    units = Units()
    for objective in spec.objectives:
        batches = OBJECTIVE_IMPLS[objective].cost(n_train, spec.train)
        per_seed = Units(train=batches, forward=sum(passes(n, EVAL_BATCH) for n in tests))
        if augmented:
            per_seed += Units(augment=adv * batches)
        if robust:
            per_seed += Units(attack=attack_passes(spec.adversarial)
                              * passes(tests[0], EVAL_BATCH))
        units += per_seed * spec.train.seeds
    return units


def robust_stats(ctx: JobContext, cut: Cut, result: Fit, test: Split) -> RobustStats:
    """The stitched and the back model on test inputs crafted by the spec's attack against
    the stitched one (against the labels), averaged over seeds; with how often the attack
    fools each of the two (its success and its transfer rate)."""
    settings, seed = ctx.spec.adversarial, ctx.spec.train.seed
    attack = ATTACK_IMPLS[settings.attack]
    assert test.pixels is not None
    evals, fooled = [], []
    for n, stitch in enumerate(result.stitches):
        h = stitched(cut, stitch, result.back)
        gen = torch.Generator().manual_seed(settings.seed)
        h_out, g_out = [], []
        for idx in batches(len(test), EVAL_BATCH):
            ctx.check_cancel()
            x, y = test.pixels[idx].to(ctx.device), test.labels[idx].to(ctx.device)
            x_adv = attack.run(h, x, y, settings, gen)
            with torch.no_grad():
                h_out.append(h(x_adv).float().cpu())
                g_out.append(cut.g.logits(x_adv).float().cpu())
            ctx.tracker.step(attack_passes(settings), "attack")
        h_logits, g_logits = torch.cat(h_out), torch.cat(g_out)
        evals.append(evaluate(h_logits, g_logits, test.labels, seed=seed))
        clean = result.logits[n][0].argmax(-1)
        fooled.append((_fooled(clean, h_logits, test.labels),
                       _fooled(test.back_logits.all().argmax(-1), g_logits, test.labels)))
    values = {k: seed_interval([getattr(e.figures, k) for e in evals])
              for k in ("agreement", "hard_agreement", "accuracy")}
    ci = evals[0].ci["agreement"] if len(evals) == 1 else values["agreement"][1]
    return RobustStats(
        agreement=values["agreement"][0], agreement_ci=ci,
        hard_agreement=values["hard_agreement"][0], accuracy=values["accuracy"][0],
        back_accuracy=float(np.mean([e.back_accuracy for e in evals])),
        epsilon=settings.attack_epsilon(), steps=settings.attack_steps(),
        step_size=settings.attack_step_size(), attack=settings.attack,
        success_rate=float(np.mean([s for s, _ in fooled])),
        transfer_rate=float(np.mean([t for _, t in fooled])),
    )


def _fooled(clean_pred: torch.Tensor, attacked: torch.Tensor, labels: torch.Tensor) -> float:
    """The share of the inputs a model gets right that it gets wrong once attacked."""
    right = clean_pred.cpu() == labels.cpu()
    wrong = attacked.argmax(-1).cpu() != labels.cpu()
    return float((right & wrong).sum() / right.sum().clamp(min=1))


def make_row(ctx: JobContext, cut: Cut, objective: Objective, protocol: Protocol,
             h_logits: list[torch.Tensor], test: Split, result: Fit, **extra: Any) -> ResultRow:
    """The figures of one stitched model against the back model on one test split, as the
    back model's output kind scores them."""
    g_out, seed, kind = test.back_logits.all(), ctx.spec.train.seed, cut.g.output
    evals = [OUTPUTS[kind].score(h, g_out, test.labels, seed) for h in h_logits]
    scored = evals[0] if len(evals) == 1 else Scored.over_seeds(evals)
    back_accuracy = evals[0].back_accuracy if test.back_accuracy is None else test.back_accuracy
    accuracy = scored.values.get("accuracy")
    penalty = (back_accuracy - accuracy
               if accuracy is not None and back_accuracy is not None else None)
    return ResultRow(
        direction=cut.direction, front_layer=cut.pair[0], back_layer=cut.pair[1],
        objective=objective, protocol=protocol, output=kind, figures=scored.figures(),
        stitching_penalty=penalty,
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
        entry = PROTOCOL_IMPLS[protocol]
        if control is not None and not catalogue.PROTOCOLS[protocol].in_controls:
            continue
        ctx.tracker.focus(point=cut.label, protocol=protocol)
        train, stats = entry.train_split(ctx, cut, inputs, points)
        if made is not None:
            made[protocol] = train
        own = [entry.test_split(ctx, cut)] * len(tests) if entry.test_split else tests
        ctx.tracker.enter(f"train {cut.label} {protocol}")
        alphas = _alphas(ctx, protocol)
        for alpha in alphas:
            # alpha 0 attacks nothing: the clean arm, fitted without an augment at all.
            augment = entry.augment(ctx, cut, points, alpha) if entry.augment and alpha else None
            for objective in ctx.spec.objectives:
                result = fit(ctx, cut, objective, train, own, augment)
                attacked = None
                if robust and entry.test_split is None:
                    attacked = robust_stats(ctx, cut, result, own[0])
                drawn = (catalogue.OUTPUT_KINDS[cut.g.output].grid and control is None
                         and objective == ctx.spec.objectives[0] and alpha == alphas[0])
                for k, test in enumerate(own):
                    grid = image_grid(cut, test, result.on(k)[0]) if drawn and k == 0 else None
                    rows[k].append(make_row(
                        ctx, cut, objective, protocol, result.on(k), test, result, iri=stats,
                        control=control, robust=attacked if k == 0 else None, alpha=alpha,
                        grid=grid, **extra))
    return rows


def protocol_rows_units(spec: Spec, sizes: Sizes, tests: Sequence[int], *,
                        control: bool = False) -> Units:
    """protocol_rows for one cut on the training split: each protocol's training split (its
    entry's count), then its fits."""
    total = Units()
    for protocol in spec.protocols:
        entry = PROTOCOL_IMPLS[protocol]
        if control and not catalogue.PROTOCOLS[protocol].in_controls:
            continue
        n_fit, own = sizes.train, list(tests)
        if entry.test_split is not None:  # its own data, and its own test split
            n_fit = sizes.front_train or sizes.train
            own = [sizes.front_test or sizes.test] * len(tests)
            total += Units(forward=passes(own[0], EVAL_BATCH))
        total += entry.cost(spec, n_fit)
        robust = spec.adversarial.evaluate and not control and entry.test_split is None
        # An attacking protocol fits once per alpha (alpha 0: the clean arm, no augment).
        alphas = spec.adversarial.alpha_list() if entry.augment is not None else [0.0]
        for alpha in alphas:
            total += fit_units(spec, n_fit, own, augmented=alpha > 0, robust=robust)
    return total


def _alphas(ctx: JobContext, protocol: Protocol) -> list[float | None]:
    """The alphas a protocol runs at: the spec's for one that attacks, else none."""
    if catalogue.PROTOCOLS[protocol].attacks:
        return list(ctx.spec.adversarial.alpha_list())
    return [None]


def training_inputs(ctx: JobContext) -> InputSet:
    data = ctx.prep.data
    return InputSet(ctx.train_pixels, data.train.labels, data.digest)
