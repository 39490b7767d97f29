"""The controls (DESIGN §1), one registered entry each: reference runs that say how to read a
comparison's figures (a ceiling, a floor, a shortcut probe). Each runs per direction and
returns rows shaped like the comparison's, with a `control` key. Adding one is one
`register_control` call plus its name in the contract's `Control`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stitchsim.models import Control, Direction, ResultRow, Spec
from stitchsim_worker.engine.context import JobContext
from stitchsim_worker.engine.data import add_marker, clustered_noise
from stitchsim_worker.engine.fitting import (
    alignment_points,
    fit,
    make_row,
    protocol_rows,
    training_inputs,
)
from stitchsim_worker.engine.splits import InputSet, images_split, test_split, train_split
from stitchsim_worker.engine.splits import with_inputs as split_with_inputs


@dataclass(frozen=True)
class ControlEntry:
    name: Control
    label: str
    description: str
    run: Callable[[JobContext, Direction], list[ResultRow]]
    runs: Callable[[Spec], int]
    """How many protocol runs' worth of work it costs per stitch pair, for the progress plan."""


CONTROLS: dict[str, ControlEntry] = {}


def register_control(entry: ControlEntry) -> ControlEntry:
    if entry.name in CONTROLS:
        raise ValueError(f"control {entry.name!r} is registered twice")
    CONTROLS[entry.name] = entry
    return entry


def _once(_spec: Spec) -> int:
    return 1


# ---------------------------------------------------------------- clustered noise: the floor

_NOISE_CENTRES_SEED_OFFSET = 7
_NOISE_TRAIN_SEED, _NOISE_TEST_SEED = 11, 12


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
        shape = cut.g.shapes[cut.j]
        for sigma in spec.control_settings.noise_sigmas:
            train, test = (
                split_with_inputs(real, ctx.bank(
                    clustered_noise(real.labels, shape, sigma, centres_seed, noise_seed)))
                for real, noise_seed in ((real_train, _NOISE_TRAIN_SEED),
                                         (real_test, _NOISE_TEST_SEED))
            )
            for objective in spec.objectives:
                result = fit(ctx, cut, objective, train, [test])
                result.stitch = "clustered noise -> " + result.stitch
                rows.append(make_row(ctx, cut, objective, "standard", result.on(0), test,
                                     result, control="clustered_noise", sigma=sigma))
    return rows


register_control(ControlEntry(
    name="clustered_noise", label="clustered noise (floor)",
    description="one noise centre per class fed through T into the back model: the accuracy a "
    "representation with nothing but class clusters reaches, the floor for standard scores",
    run=_clustered_noise, runs=lambda spec: len(spec.control_settings.noise_sigmas),
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


register_control(ControlEntry(
    name="identity", label="identity (ceiling)",
    description="the back model stitched into itself at the same point: agreement near 1 is "
    "the ceiling, and a sanity check of the stitch",
    run=_identity, runs=_once,
))


# ---------------------------------------------------------------- shortcut: excessive agreement


def _shortcut(ctx: JobContext, direction: Direction) -> list[ResultRow]:
    """A class-coloured marker during stitch training; at test time the right markers versus
    markers rolled by one class. Agreement that follows the marker is excessive agreement."""
    data, side = ctx.prep.data, ctx.spec.control_settings.shortcut_marker
    k = data.n_classes
    inputs = InputSet(ctx.bank(add_marker(data.train.images, data.train.labels, side)),
                      data.train.labels, f"{data.digest}|marker{side}")
    right_x = add_marker(data.test.images, data.test.labels, side)
    rolled_x = add_marker(data.test.images, (data.test.labels + 1) % k, side)
    rows = []
    for cut in ctx.cuts(direction):
        ctx.tracker.enter(f"control shortcut {cut.label}")
        tests = [images_split(ctx, cut, x, data.test.labels) for x in (right_x, rolled_x)]
        right, rolled = protocol_rows(ctx, cut, inputs, tests)
        for r, q in zip(right, rolled, strict=True):
            rows.append(r.model_copy(update={
                "control": "shortcut", "rolled_agreement": q.agreement,
                "excessive_agreement": r.agreement - q.agreement,
            }))
    return rows


register_control(ControlEntry(
    name="shortcut", label="shortcut marker",
    description="a class-coloured marker during stitch training; excessive agreement is the "
    "agreement with the right markers minus with markers rolled by one class",
    run=_shortcut, runs=_once,
))
