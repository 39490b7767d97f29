"""The protocols (DESIGN §1), one registered entry each: what the stitch is trained on.

An entry turns a run's training inputs into the split T is fitted on (and the figures that
describe how it was made, such as IRI convergence), and says what that costs for the progress
plan. Every protocol is evaluated on the normal test split. Adding one is one
`register_protocol` call plus its name in the contract's `Protocol`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from stitchsim.models import IRIStats, Protocol, Spec
from stitchsim_worker.engine import iri
from stitchsim_worker.engine.context import Cut, JobContext
from stitchsim_worker.engine.splits import InputSet, Split, train_split

TrainSplitFn = Callable[[JobContext, Cut, InputSet, list[str]], tuple[Split, IRIStats | None]]


@dataclass(frozen=True)
class ProtocolEntry:
    name: Protocol
    label: str
    description: str
    train_split: TrainSplitFn
    """(ctx, cut, training inputs, back alignment points) -> split to fit T on, and stats."""
    cost: Callable[[Spec, int], int]
    """Work units it adds to one stitch on n training samples, beyond fitting."""


PROTOCOLS: dict[str, ProtocolEntry] = {}


def register_protocol(entry: ProtocolEntry) -> ProtocolEntry:
    if entry.name in PROTOCOLS:
        raise ValueError(f"protocol {entry.name!r} is registered twice")
    PROTOCOLS[entry.name] = entry
    return entry


# ---------------------------------------------------------------- standard


def _standard(
    ctx: JobContext, cut: Cut, inputs: InputSet, points: list[str]
) -> tuple[Split, IRIStats | None]:
    return train_split(ctx, cut, inputs.pixels, inputs.labels, points), None


def _no_cost(_spec: Spec, _n: int) -> int:
    return 0


register_protocol(ProtocolEntry(
    name="standard", label="standard",
    description="T is trained on the training split, towards the back model's processing of it",
    train_split=_standard, cost=_no_cost,
))


# ---------------------------------------------------------------- invariance-aware


def iri_units(spec: Spec, n: int) -> int:
    return spec.iri.steps * math.ceil(n / spec.iri.batch_size)


def _iris(ctx: JobContext, cut: Cut, inputs: InputSet) -> iri.IRIResult:
    """The front model's IRIs of the training inputs at i, from the cache when it has them."""
    settings = ctx.spec.iri
    ctx.tracker.enter(f"iri {cut.f.where} {cut.i}")
    key = iri.cache_key(ctx.identity(cut.f), cut.i, inputs.digest, settings)

    def on_batch() -> None:
        ctx.check_cancel()
        ctx.tracker.step()

    result = iri.get_iris(
        key=key, cache=ctx.iri_cache, front=cut.f.front(cut.i), pixels=inputs.pixels,
        settings=settings, banks=ctx.banks, device=ctx.device, on_batch=on_batch,
    )
    stats = result.stats
    if stats.cache_hit:
        ctx.tracker.step(iri_units(ctx.spec, inputs.pixels.n))
    if not stats.converged:
        ctx.warnings.append(
            f"IRIs of the {cut.f.where} model at {cut.i} did not converge: median relative "
            f"distance {stats.median:.3f} (from {stats.start_median:.3f}; the line is "
            f"{settings.converged_below:g}); raise iri.steps or iri.step_size"
        )
    return result


def _invariance_aware(
    ctx: JobContext, cut: Cut, inputs: InputSet, points: list[str]
) -> tuple[Split, IRIStats | None]:
    result = _iris(ctx, cut, inputs)
    return train_split(ctx, cut, result.images, inputs.labels, points), result.stats


register_protocol(ProtocolEntry(
    name="invariance_aware", label="invariance-aware",
    description="T is trained on IRIs: inputs the front model cannot tell from the training "
    "inputs at the stitch point, towards the back model's own processing of the IRIs",
    train_split=_invariance_aware, cost=iri_units,
))
