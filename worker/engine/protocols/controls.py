"""The controls (DESIGN §1), one registered entry each: reference runs that say how to read a
comparison's figures (a ceiling, a floor, a shortcut probe). Each runs per direction and
returns rows shaped like the comparison's, with a `control` key. What a control is called
and how it is drawn are its catalogue entry's (stitchsim.catalogue.CONTROLS). Adding one is
its catalogue entry plus one `register_control` call here, under the same name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from stitchsim import catalogue
from stitchsim.models import Control, Direction, ResultRow, Spec
from stitchsim_worker.engine.data.datasets import clustered_noise
from stitchsim_worker.engine.job.context import EVAL_BATCH, JobContext
from stitchsim_worker.engine.job.costs import Sizes, fit_units, passes, rows_units, test_split_units
from stitchsim_worker.engine.job.progress import Units
from stitchsim_worker.engine.measures.pseudo import pseudo_classes
from stitchsim_worker.engine.protocols.cues import CUES
from stitchsim_worker.engine.registry import Registry
from stitchsim_worker.engine.stitching.activations import (
    InputSet,
    images_split,
    test_split,
    train_split,
    with_inputs as split_with_inputs,
)
from stitchsim_worker.engine.stitching.fitting import (
    alignment_points,
    fit,
    make_row,
    protocol_rows,
    training_inputs,
)


@dataclass(frozen=True)
class ControlEntry:
    name: Control
    run: Callable[[JobContext, Direction], list[ResultRow]]
    cost: Callable[[Spec, Sizes], Units]
    """Its work units in one direction, for the progress plan (costs.py)."""


CONTROLS: Registry[ControlEntry] = Registry("control")
register_control = CONTROLS.register


def controls_to_run(spec: Spec) -> list[str]:
    """The spec's controls, and those a protocol of the spec is only readable against (its
    catalogue entry's read_against: cross-task pairing's clustered-noise floor)."""
    needed = [c for p in spec.protocols for c in catalogue.PROTOCOLS[p].read_against]
    return list(dict.fromkeys([*spec.controls, *needed]))


# ---------------------------------------------------------------- clustered noise: the floor

_NOISE_CENTRES_SEED_OFFSET = 7
_NOISE_TRAIN_SEED, _NOISE_TEST_SEED = 11, 12
_BASELINE = catalogue.PROTOCOLS.one(baseline=True)
"""The floor's stitch is trained on the noise as the baseline protocol trains on images."""


def _clustered_noise(ctx: JobContext, direction: Direction) -> list[ResultRow]:
    """Class-clustered noise of the back stitch point's shape, through T into g>j, trained
    towards g's processing of the real inputs of the same class index: how much accuracy a
    representation with no information but clusters already reaches."""
    data, spec = ctx.prep.data, ctx.spec
    centres_seed = spec.train.seed + _NOISE_CENTRES_SEED_OFFSET
    rows = []
    for cut in ctx.self_cuts(direction):
        ctx.tracker.enter(f"control clustered_noise {cut.g.where} {cut.j}")
        real_train = train_split(ctx, cut, ctx.train_pixels, data.train.labels,
                                 alignment_points(ctx, cut))
        real_test = test_split(ctx, cut)
        classes = _classes(ctx, real_train.back_logits.all(), real_test.back_logits.all())
        shape = cut.g.shapes[cut.j]
        for sigma in spec.control_settings.noise_sigmas:
            train, test = (
                split_with_inputs(real, ctx.bank(
                    clustered_noise(labels, shape, sigma, centres_seed, noise_seed)))
                for real, labels, noise_seed in ((real_train, classes[0], _NOISE_TRAIN_SEED),
                                                 (real_test, classes[1], _NOISE_TEST_SEED))
            )
            for objective in spec.objectives:
                result = fit(ctx, cut, objective, train, [test])
                result.stitch = "clustered noise -> " + result.stitch
                rows.append(make_row(ctx, cut, objective, _BASELINE, result.on(0), test,
                                     result, control="clustered_noise", sigma=sigma))
    return rows


def _classes(ctx: JobContext, train_out: torch.Tensor, test_out: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The classes a control is built from: the labels, or on data without labels the
    pseudo-classes of the back model's outputs (k-means)."""
    data = ctx.prep.data
    if data.labelled:
        return data.train.labels, data.test.labels
    return pseudo_classes(train_out, test_out, ctx.spec.train.seed)


def _clustered_noise_cost(spec: Spec, sizes: Sizes) -> Units:
    real = Units(forward=2 * passes(sizes.train, EVAL_BATCH)) + test_split_units(sizes)
    per_sigma = fit_units(spec, sizes.train, [sizes.test])
    return (real + per_sigma * len(spec.control_settings.noise_sigmas)) * sizes.pairs


register_control(ControlEntry(
    name="clustered_noise", run=_clustered_noise, cost=_clustered_noise_cost,
))


# ---------------------------------------------------------------- identity: the ceiling


def _identity(ctx: JobContext, direction: Direction) -> list[ResultRow]:
    rows = []
    for cut in ctx.self_cuts(direction):
        ctx.tracker.enter(f"control identity {cut.g.where} {cut.j}")
        (found,) = protocol_rows(ctx, cut, training_inputs(ctx), [test_split(ctx, cut)],
                                 control="identity")
        rows += found
    return rows


def _identity_cost(spec: Spec, sizes: Sizes) -> Units:
    per_cut = test_split_units(sizes) + rows_units(spec, sizes, sizes.train, [sizes.test],
                                                   control=True)
    return per_cut * sizes.pairs


register_control(ControlEntry(name="identity", run=_identity, cost=_identity_cost))


# ---------------------------------------------------------------- shortcut: the unseen-cue suite

_CUE_SEED_OFFSET = 101


def _shortcut(ctx: JobContext, direction: Direction) -> list[ResultRow]:
    """Each unseen cue painted onto the stitch-training inputs; at test time the right cues
    versus cues rolled by one class. Agreement that follows the cue is excessive agreement."""
    data, settings = ctx.prep.data, ctx.spec.control_settings
    side = settings.shortcut_marker
    train_y, test_y, k, pseudo = data.train.labels, data.test.labels, data.n_classes, ""
    if not data.labelled:  # pseudo-classes of this direction's back model
        g_net = ctx.networks(direction)[1]
        (train_out,) = ctx.compute(ctx.train_pixels, lambda x: (g_net.logits(x),))
        train_y, test_y = _classes(ctx, train_out.all(), ctx.test_logits[g_net.where].all())
        k, pseudo = int(max(train_y.max(), test_y.max())) + 1, f":pseudo:{g_net.where}"
    rows = []
    for name in settings.cues:
        cue = CUES[name]
        seed = ctx.spec.train.seed + _CUE_SEED_OFFSET
        g = torch.Generator().manual_seed(seed)
        # Marked copies of the splits the job uses (their size, not the file's).
        train_x = cue.mark(data.train.images, train_y, k, side, g)
        test_x = data.test.images
        right_x = cue.mark(test_x, test_y, k, side, g)
        rolled_x = cue.mark(test_x, (test_y + 1) % k, k, side, g)
        inputs = InputSet(ctx.bank(train_x), data.train.labels,
                          f"{data.digest}|cue:{name}:{side}:{seed}{pseudo}")
        for cut in ctx.cuts(direction):
            ctx.tracker.enter(f"control shortcut {name} {cut.label}")
            tests = [images_split(ctx, cut, x, data.test.labels) for x in (right_x, rolled_x)]
            right, rolled = protocol_rows(ctx, cut, inputs, tests, control="shortcut")
            for r, q in zip(right, rolled, strict=True):
                rows.append(r.model_copy(update={
                    "cue": name, "rolled_agreement": q.agreement,
                    "excessive_agreement": r.agreement - q.agreement,
                }))
    return rows


def _shortcut_cost(spec: Spec, sizes: Sizes) -> Units:
    # Two test splits of marked images (right and rolled cues), both models on each.
    marked = Units(forward=2 * 2 * passes(sizes.test, EVAL_BATCH))
    per_cut = marked + rows_units(spec, sizes, sizes.train, [sizes.test] * 2, control=True)
    return per_cut * (sizes.pairs * len(spec.control_settings.cues))


register_control(ControlEntry(name="shortcut", run=_shortcut, cost=_shortcut_cost))
