"""The controls (docs/method.md), one registered entry each: reference runs that say how to read a
comparison's figures (a ceiling, a floor, a shortcut probe). Each runs per direction as steps
of the job (core/step.py: at each stitch pair, or cue and pair, a step that makes its splits,
then one per fit), each with its work units beside its run, and returns rows shaped like the
comparison's, with a `control` key. What a control is called and
how it is drawn are its catalogue entry's (stitchsim.catalogue.CONTROLS). Adding one is its
catalogue entry plus one `register_control` call here, under the same name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from stitchsim import catalogue
from stitchsim.models import Control, Direction, Objective, ResultRow, Spec
from stitchsim_worker.engine.core.context import (
    Cut,
    JobContext,
    cut_label,
    front_point,
    self_point,
)
from stitchsim_worker.engine.core.costs import Sizes
from stitchsim_worker.engine.core.registry import Registry
from stitchsim_worker.engine.core.step import JobRun, Pair, Step
from stitchsim_worker.engine.data.datasets import clustered_noise
from stitchsim_worker.engine.measures.pseudo import pseudo_classes
from stitchsim_worker.engine.protocols.cues import CUE_IMPLS
from stitchsim_worker.engine.protocols.fitting import (
    Fitting,
    SeedFitFn,
    alignment_points,
    fit_seed,
    make_row,
    protocol_steps,
    start_fit,
    training_inputs,
)
from stitchsim_worker.engine.stitching.activations import (
    ExtractFn,
    ImagesFn,
    InputSet,
    Split,
    SplitFn,
    images_split,
    test_split,
    train_split,
    with_inputs as split_with_inputs,
)

StepsFn = Callable[[Spec, Sizes, Direction, Sequence[Pair]], list[Step]]


@dataclass(frozen=True)
class ControlImpl:
    name: Control
    steps: StepsFn
    """(spec, sizes, direction, stitch pairs) -> its steps in that direction, each with its
    work units and how it runs (the job's step list, plan.py)."""


CONTROL_IMPLS: Registry[ControlImpl] = Registry("control")
register_control = CONTROL_IMPLS.register


def controls_to_run(spec: Spec) -> list[str]:
    """The spec's controls, and those a protocol of the spec is only readable against (its
    catalogue entry's read_against: cross-task pairing's clustered-noise floor)."""
    needed = [c for p in spec.protocols for c in catalogue.PROTOCOLS[p].read_against]
    return list(dict.fromkeys([*spec.controls, *needed]))


# ---------------------------------------------------------------- clustered noise: the floor

_NOISE_CENTRES_SEED_OFFSET = 7
_NOISE_TRAIN_SEED, _NOISE_TEST_SEED = 11, 12
"""The floor's stitch is trained on the noise as the baseline protocol trains on images."""


@dataclass
class _Floor:
    """What one cut's clustered-noise steps share: the noise splits per sigma, made by the
    first step, and the running objective's fits."""

    cut: Cut | None = None
    splits: dict[float, tuple[Split, Split]] = field(default_factory=dict)
    fitting: Fitting | None = None


def _clustered_noise_steps(spec: Spec, sizes: Sizes, direction: Direction,
                           pairs: Sequence[Pair]) -> list[Step]:
    """Class-clustered noise of the back stitch point's shape, through T into g>j, trained
    towards g's processing of the real inputs of the same class index: how much accuracy a
    representation with no information but clusters already reaches. At each pair: a step
    for the real splits (both models on the training split, the test split) and the noise,
    then one per sigma, objective and seed."""
    steps = []
    real_train, real_test = train_split(sizes.train), test_split(sizes.test)
    for pair in pairs:
        floor = _Floor()
        steps.append(Step(f"control clustered_noise {' '.join(self_point(direction, pair))}",
                          real_train.units + real_test.units,
                          _noise_splits(floor, direction, pair, real_train.run, real_test.run)))
        for sigma in spec.control_settings.noise_sigmas:
            for objective in spec.objectives:
                fit = fit_seed(spec, objective, sizes.train, [sizes.test])
                for s in range(spec.train.seeds):
                    steps.append(Step(None, fit.units,
                                      _noise_fit(floor, sigma, objective, s, fit.run),
                                      "control"))
    return steps


def _noise_splits(floor: _Floor, direction: Direction, pair: Pair, extract: ExtractFn,
                  test: SplitFn) -> Callable[[JobRun], None]:
    def run(job: JobRun) -> None:
        ctx = job.ctx
        data, spec = ctx.prep.data, ctx.spec
        cut = floor.cut = ctx.self_cut(direction, pair)
        centres_seed = spec.train.seed + _NOISE_CENTRES_SEED_OFFSET
        real_train = extract(ctx, cut, ctx.train_pixels, data.train.labels,
                             alignment_points(ctx, cut), None)
        real_test = test(ctx, cut)
        classes = _classes(ctx, real_train.back_logits.all(), real_test.back_logits.all())
        shape = cut.g.shapes[cut.j]
        for sigma in spec.control_settings.noise_sigmas:
            floor.splits[sigma] = tuple(  # type: ignore[assignment]
                split_with_inputs(real, ctx.bank(
                    clustered_noise(labels, shape, sigma, centres_seed, noise_seed)))
                for real, labels, noise_seed in ((real_train, classes[0], _NOISE_TRAIN_SEED),
                                                 (real_test, classes[1], _NOISE_TEST_SEED))
            )

    return run


def _noise_fit(floor: _Floor, sigma: float, objective: Objective, s: int, fit: SeedFitFn
               ) -> Callable[[JobRun], None]:
    """One seed's fit on one sigma's noise; the last seed's makes the objective's row."""

    def run(job: JobRun) -> None:
        ctx, cut = job.ctx, floor.cut
        assert cut is not None
        train, test = floor.splits[sigma]
        if s == 0:
            floor.fitting = start_fit(ctx, cut, objective)
        assert floor.fitting is not None
        fit(ctx, cut, floor.fitting, s, train, [test], None)
        if s == ctx.spec.train.seeds - 1:
            result = floor.fitting.done()
            result.stitch = "clustered noise -> " + result.stitch
            job.controls.append(make_row(
                ctx, cut, objective, catalogue.BASELINE_PROTOCOL, result.on(0), test, result,
                control="clustered_noise", sigma=sigma))
            if sigma == ctx.spec.control_settings.noise_sigmas[-1] \
                    and objective == ctx.spec.objectives[-1]:
                floor.splits.clear()  # the cut's noise is done with

    return run


def _classes(ctx: JobContext, train_out: torch.Tensor, test_out: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The classes a control is built from: the labels, or on data without labels the
    pseudo-classes of the back model's outputs (k-means)."""
    data = ctx.prep.data
    if data.labelled:
        return data.train.labels, data.test.labels
    return pseudo_classes(train_out, test_out, ctx.spec.train.seed)


register_control(ControlImpl(name="clustered_noise", steps=_clustered_noise_steps))


# ---------------------------------------------------------------- identity: the ceiling


def _identity_steps(spec: Spec, sizes: Sizes, direction: Direction, pairs: Sequence[Pair]
                    ) -> list[Step]:
    """The protocols on the back model stitched into itself at each pair's back point."""
    steps, test = [], test_split(sizes.test)
    for pair in pairs:
        model, point = self_point(direction, pair)

        def begin(job: JobRun, pair: Pair = pair) -> tuple[Cut, InputSet, list[Split]]:
            cut = job.ctx.self_cut(direction, pair)
            return cut, training_inputs(job.ctx), [test.run(job.ctx, cut)]

        steps += protocol_steps(spec, sizes, (f"control identity {model} {point}",
                                              test.units),
                                begin, _keep_control_rows, f"{direction} {point}->{point}",
                                (model, point), [sizes.test], control="identity")
    return steps


def _keep_control_rows(job: JobRun, rows: list[list[ResultRow]], _tests: list[Split],
                       _made: dict) -> None:
    (found,) = rows
    job.controls.extend(found)


register_control(ControlImpl(name="identity", steps=_identity_steps))


# ---------------------------------------------------------------- shortcut: the unseen-cue suite

_CUE_SEED_OFFSET = 101


@dataclass(frozen=True)
class _Marked:
    """One cue's marked copies of the splits the job uses (their size, not the file's): the
    training inputs, and the test images with the right cues and with cues rolled by one."""

    inputs: InputSet
    right: torch.Tensor
    rolled: torch.Tensor


Classes = tuple[torch.Tensor, torch.Tensor, int, str]
"""The training and test classes the cues follow, their number, and a tag for the cache key."""


@dataclass
class _Cues:
    """What a direction's shortcut steps share: the classes, and each cue's marked inputs
    while its pairs still run."""

    classes: Classes | None = None
    marked: dict[str, _Marked] = field(default_factory=dict)


def _classes_to_mark(ctx: JobContext, direction: Direction) -> Classes:
    """The classes the cues follow: the labels, or on data without labels this direction's
    back model's pseudo-classes."""
    data = ctx.prep.data
    if data.labelled:
        return data.train.labels, data.test.labels, data.n_classes, ""
    g_net = ctx.networks(direction)[1]
    (train_out,) = ctx.compute(ctx.train_pixels, lambda x: (g_net.logits(x),))
    train_y, test_y = _classes(ctx, train_out.all(), ctx.test_logits[g_net.where].all())
    return train_y, test_y, int(max(train_y.max(), test_y.max())) + 1, f":pseudo:{g_net.where}"


def _mark(ctx: JobContext, name: str, classes: Classes) -> _Marked:
    data, side = ctx.prep.data, ctx.spec.control_settings.shortcut_marker
    train_y, test_y, k, pseudo = classes
    cue = CUE_IMPLS[name]
    seed = ctx.spec.train.seed + _CUE_SEED_OFFSET
    g = torch.Generator().manual_seed(seed)
    train_x = cue.mark(data.train.images, train_y, k, side, g)
    right_x = cue.mark(data.test.images, test_y, k, side, g)
    rolled_x = cue.mark(data.test.images, (test_y + 1) % k, k, side, g)
    inputs = InputSet(ctx.bank(train_x), data.train.labels,
                      f"{data.digest}|cue:{name}:{side}:{seed}{pseudo}")
    return _Marked(inputs, right_x, rolled_x)


def _shortcut_steps(spec: Spec, sizes: Sizes, direction: Direction, pairs: Sequence[Pair]
                    ) -> list[Step]:
    """Each unseen cue painted onto the stitch-training inputs; at test time the right cues
    versus cues rolled by one class. Agreement that follows the cue is excessive agreement.
    One step per cue and pair; a cue's marked inputs are made by its first step and kept
    for the pairs after it (then let go)."""
    # Two test splits of marked images: right and rolled cues.
    marked, cues, steps = images_split(sizes.test), _Cues(), []
    for name in spec.control_settings.cues:
        for n, pair in enumerate(pairs):
            label = cut_label(direction, pair)
            steps += protocol_steps(
                spec, sizes, (f"control shortcut {name} {label}", marked.units * 2),
                _shortcut_begin(name, direction, pair, cues, marked.run,
                                last=n == len(pairs) - 1),
                _shortcut_finish(name), label, front_point(direction, pair), [sizes.test] * 2,
                control="shortcut")
    return steps


def _shortcut_begin(name: str, direction: Direction, pair: Pair, cues: _Cues,
                    images: ImagesFn, last: bool
                    ) -> Callable[[JobRun], tuple[Cut, InputSet, list[Split]]]:
    def begin(job: JobRun) -> tuple[Cut, InputSet, list[Split]]:
        ctx = job.ctx
        if cues.classes is None:  # once a direction, for every cue
            cues.classes = _classes_to_mark(ctx, direction)
        if name not in cues.marked:
            cues.marked[name] = _mark(ctx, name, cues.classes)
        marked = cues.marked.pop(name) if last else cues.marked[name]
        cut, labels = ctx.cut(direction, pair), ctx.prep.data.test.labels
        tests = [images(ctx, cut, x, labels) for x in (marked.right, marked.rolled)]
        return cut, marked.inputs, tests

    return begin


def _shortcut_finish(name: str) -> Callable[[JobRun, list[list[ResultRow]], list[Split], dict],
                                            None]:
    def finish(job: JobRun, rows: list[list[ResultRow]], _tests: list[Split],
               _made: dict) -> None:
        right, rolled = rows
        for r, q in zip(right, rolled, strict=True):
            job.controls.append(r.model_copy(update={
                "cue": name, "rolled_agreement": q.agreement,
                "excessive_agreement": r.agreement - q.agreement,
            }))

    return finish


register_control(ControlImpl(name="shortcut", steps=_shortcut_steps))
