"""Fitting T for one stitch and turning its test logits into a report row."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from stitchsim import catalogue
from stitchsim.models import Control, IRIStats, Objective, Protocol, ResultRow, RobustStats, Spec
from stitchsim_worker.engine.core.bank import batches
from stitchsim_worker.engine.core.context import EVAL_BATCH, Cut, JobContext
from stitchsim_worker.engine.core.costs import Sizes, passes
from stitchsim_worker.engine.core.progress import Units, Work
from stitchsim_worker.engine.core.step import JobRun, Step
from stitchsim_worker.engine.measures.metrics import evaluate, seed_interval
from stitchsim_worker.engine.measures.outputs import OUTPUTS, Scored
from stitchsim_worker.engine.models.attacks import ATTACK_IMPLS, attack_passes
from stitchsim_worker.engine.models.cutting import BackPart
from stitchsim_worker.engine.protocols import PROTOCOL_IMPLS, stitched
from stitchsim_worker.engine.stitching.activations import InputSet, Split
from stitchsim_worker.engine.stitching.grids import image_grid
from stitchsim_worker.engine.stitching.layer import (
    MIN_VECTORS_PER_UNKNOWN,
    StitchLayer,
    samples_needed,
    unknowns_per_output,
    vectors_of,
)
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


@dataclass
class Fitting:
    """One objective's fits at one cut as its seeds run, one step each (protocol_steps)."""

    objective: Objective
    back: BackPart
    started: float
    logits: list[list[torch.Tensor]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    stitches: list[StitchLayer] = field(default_factory=list)

    def done(self) -> Fit:
        return Fit(self.logits, float(np.mean(self.losses)), self.stitches[0].describe(),
                   time.perf_counter() - self.started, self.stitches, self.back)


def start_fit(ctx: JobContext, cut: Cut, objective: Objective) -> Fitting:
    aligns_later = catalogue.OBJECTIVES[objective].aligns_later_points
    later = cut.g.later_points(cut.j, ctx.spec.fula.points) if aligns_later else []
    return Fitting(objective, cut.g.back(cut.j, later), time.perf_counter())


SeedFitFn = Callable[[JobContext, Cut, Fitting, int, Split, list[Split], Augment | None], None]
"""(ctx, cut, the objective's fits so far, seed index s, training split, test splits, the
alpha's augment) -> T of the s-th seed trained and evaluated on each test split."""
RobustFn = Callable[[JobContext, Cut, Fit, Split], RobustStats]


def fit_seed(spec: Spec, objective: Objective, n_train: int, tests: Sequence[int], *,
             augmented: bool = False) -> Work[SeedFitFn]:
    """One seed's fit of T on n_train inputs, then its stitched model on each test split (of
    the sizes `tests`); an augmented fit crafts PGD inputs in every training batch."""
    fit = OBJECTIVE_IMPLS[objective].fit(n_train, spec.train)
    units = fit.units + Units(forward=sum(passes(n, EVAL_BATCH) for n in tests))
    if augmented:
        units += Units(augment=spec.adversarial.steps * fit.units.by_kind.get("train", 0))

    def run(ctx: JobContext, cut: Cut, fitting: Fitting, s: int, train: Split,
            test_splits: list[Split], augment: Augment | None) -> None:
        settings = ctx.spec.train
        ctx.tracker.focus(objective=fitting.objective)
        stitch = StitchLayer(cut.f.rep(cut.i), cut.g.rep(cut.j)).to(ctx.device)
        if s == 0:
            _warn_if_few_vectors(ctx, cut, stitch, len(train))
        task = FitTask(stitch, fitting.back, train, settings, settings.seed + s, ctx.device,
                       ctx.tracker.counter("train"), ctx.tracker.should_cancel, augment,
                       output=cut.g.output)
        fitting.losses.append(fit.run(task))
        fitting.stitches.append(stitch)
        fitting.logits.append([stitched_logits(stitch, fitting.back, t, EVAL_BATCH,
                                               ctx.device, ctx.tracker.step)
                               for t in test_splits])
        ctx.tracker.focus(objective=None)

    return Work(units, run)


def _warn_if_few_vectors(ctx: JobContext, cut: Cut, stitch: StitchLayer, n: int) -> None:
    """A stitch fitted from too few activation vectors per unknown, named with the training
    samples that would be enough (a spec's own max_train_samples wins over the ci budget's)."""
    vectors, unknowns = vectors_of(stitch.dst, n), unknowns_per_output(stitch.src)
    if vectors >= MIN_VECTORS_PER_UNKNOWN * unknowns:
        return
    warning = (
        f"the stitch at {cut.f.where} {cut.i} -> {cut.g.where} {cut.j} fits {unknowns} "
        f"unknowns per output channel from {vectors} activation vectors ({n} samples, "
        f"{vectors / unknowns:.1f} per unknown, under {MIN_VECTORS_PER_UNKNOWN}): its figures "
        f"there are likely low for want of samples: it needs "
        f"{samples_needed(stitch.src, stitch.dst)} training samples (train.max_train_samples, "
        "and a dataset that has them)")
    if warning not in ctx.warnings:
        ctx.warnings.append(warning)


def robust_stats(spec: Spec, n_test: int) -> Work[RobustFn]:
    """The stitched and the back model on n_test inputs crafted by the spec's attack against
    the stitched one (against the labels), every seed's, averaged over seeds; with how often
    the attack fools each of the two (its success and its transfer rate)."""
    per_batch = attack_passes(spec.adversarial)

    def run(ctx: JobContext, cut: Cut, result: Fit, test: Split) -> RobustStats:
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
                ctx.tracker.step(per_batch, "attack")
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

    return Work(Units(attack=per_batch * passes(n_test, EVAL_BATCH) * spec.train.seeds), run)


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


Begin = Callable[[JobRun], tuple[Cut, InputSet, list[Split]]]
"""The opening step's work at a cut: the cut, the training inputs and the test splits."""
Finish = Callable[[JobRun, list[list[ResultRow]], list[Split], dict[Protocol, Split]], None]
"""What takes the cut's rows (rows[k]: each fit on tests[k]), its tests and the training
splits its protocols made."""


@dataclass
class _AtCut:
    """What one cut's protocol steps share as they run: the opening step's cut, inputs and
    tests, the rows so far, and the running protocol's split and objective's fits."""

    cut: Cut | None = None
    inputs: InputSet | None = None
    tests: list[Split] = field(default_factory=list)
    rows: list[list[ResultRow]] = field(default_factory=list)
    made: dict[Protocol, Split] = field(default_factory=dict)
    train: Split | None = None
    stats: IRIStats | None = None
    own: list[Split] = field(default_factory=list)
    augment: Augment | None = None
    """The running alpha's, made by its first fit and shared by its objectives and seeds (its
    attack's generator runs on across them)."""
    fitting: Fitting | None = None


def protocol_steps(spec: Spec, sizes: Sizes, opening: tuple[str, Units], begin: Begin,
                   finish: Finish, label: str, front: tuple[str, str], tests: Sequence[int],
                   *, control: Control | None = None) -> list[Step]:
    """Every protocol and objective at one cut, one step per piece: the opening step (its
    stage and units `opening`, its work `begin`), then for each protocol its training
    split, and a step for each alpha, objective and seed; the last hands the rows to
    `finish`. `label` is the cut's (Cut.label), `front` its front part's (model, point) and
`tests` the sizes of the test splits."""
    at = _AtCut()

    def open_cut(job: JobRun) -> None:
        at.cut, at.inputs, at.tests = begin(job)
        at.rows = [[] for _ in at.tests]

    steps = [Step(*opening, open_cut)]
    for protocol in spec.protocols:
        if control is None or catalogue.PROTOCOLS[protocol].in_controls:
            steps += _protocol_steps(spec, sizes, at, protocol, (label, front), tests,
                                     control, steps[0].part)
    last = steps[-1]

    def run_last(job: JobRun) -> None:
        last.run(job)
        finish(job, at.rows, at.tests, at.made)

    steps[-1] = Step(last.stage, last.units, run_last, last.part)
    return steps


def _protocol_steps(spec: Spec, sizes: Sizes, at: _AtCut, protocol: Protocol,
                    cut: tuple[str, tuple[str, str]], tests: Sequence[int],
                    control: Control | None, part: str) -> list[Step]:
    """One protocol at one cut: its training split (in its own stage, the IRIs', or the stage
    before it), then its fits, each alpha, objective and seed a step, in its train stage."""
    entry, (label, front) = PROTOCOL_IMPLS[protocol], cut
    n_fit, own = sizes.train, list(tests)
    own_test = None
    if entry.test_split is not None:  # its own data, and its own test split
        n_fit = sizes.front_train or sizes.train
        own_test = entry.test_split(sizes.front_test or sizes.test)
        own = [sizes.front_test or sizes.test] * len(tests)
    train = entry.train_split(spec, n_fit)

    def split(job: JobRun) -> None:
        ctx, cut = job.ctx, at.cut
        assert cut is not None and at.inputs is not None
        ctx.tracker.focus(point=cut.label, protocol=protocol)
        at.train, at.stats = train.run(ctx, cut, at.inputs, alignment_points(ctx, cut))
        at.made[protocol] = at.train
        at.own = [own_test.run(ctx, cut)] * len(at.tests) if own_test else at.tests

    split_units = train.units + (own_test.units if own_test else Units())
    steps = [Step(entry.split_stage(*front) if entry.split_stage else None, split_units, split,
                  part)]
    attack = (robust_stats(spec, own[0])
              if spec.adversarial.evaluate and control is None and own_test is None else None)
    alphas = _alphas(spec, protocol)
    stage: str | None = f"train {label} {protocol}"
    for alpha in alphas:
        for objective in spec.objectives:
            seed = fit_seed(spec, objective, n_fit, own, augmented=bool(alpha))
            for s in range(spec.train.seeds):
                closes = s == spec.train.seeds - 1
                units = seed.units + (attack.units if closes and attack else Units())
                steps.append(Step(stage, units, _fit_step(
                    at, protocol, alpha, objective, s, seed.run, closes=closes,
                    robust=attack.run if attack else None,
                    new_alpha=s == 0 and objective == spec.objectives[0],
                    drawn=control is None and objective == spec.objectives[0]
                    and alpha == alphas[0], control=control), part))
                stage = None
    return steps


def _fit_step(at: _AtCut, protocol: Protocol, alpha: float | None, objective: Objective,
              s: int, fit: SeedFitFn, *, closes: bool, robust: RobustFn | None,
              new_alpha: bool, drawn: bool, control: Control | None
              ) -> Callable[[JobRun], None]:
    """One seed's fit; the last seed's step also scores the objective's fits into rows (with
    the robust evaluation, when there is one)."""

    def run(job: JobRun) -> None:
        ctx, cut, entry = job.ctx, at.cut, PROTOCOL_IMPLS[protocol]
        assert cut is not None and at.train is not None
        if s == 0:
            at.fitting = start_fit(ctx, cut, objective)
        assert at.fitting is not None
        if new_alpha:
            # alpha 0 attacks nothing: the clean arm, fitted without an augment at all.
            at.augment = (entry.augment(ctx, cut, alignment_points(ctx, cut), alpha)
                          if entry.augment and alpha else None)
        fit(ctx, cut, at.fitting, s, at.train, at.own, at.augment)
        if closes:
            _score(ctx, cut, at, objective, protocol, alpha, robust,
                   drawn and catalogue.OUTPUT_KINDS[cut.g.output].grid, control)

    return run


def _score(ctx: JobContext, cut: Cut, at: _AtCut, objective: Objective, protocol: Protocol,
           alpha: float | None, robust: RobustFn | None, drawn: bool,
           control: Control | None) -> None:
    """The objective's fits (every seed) as rows, one per test split."""
    assert at.fitting is not None
    result = at.fitting.done()
    attacked = robust(ctx, cut, result, at.own[0]) if robust else None
    for k, test in enumerate(at.own):
        grid = image_grid(cut, test, result.on(k)[0]) if drawn and k == 0 else None
        at.rows[k].append(make_row(
            ctx, cut, objective, protocol, result.on(k), test, result,
            iri=at.stats, control=control, robust=attacked if k == 0 else None, alpha=alpha,
            grid=grid))


def _alphas(spec: Spec, protocol: Protocol) -> list[float | None]:
    """The alphas a protocol runs at: the spec's for one that attacks, else none."""
    if catalogue.PROTOCOLS[protocol].attacks:
        return list(spec.adversarial.alpha_list())
    return [None]


def training_inputs(ctx: JobContext) -> InputSet:
    data = ctx.prep.data
    return InputSet(ctx.train_pixels, data.train.labels, data.digest)
