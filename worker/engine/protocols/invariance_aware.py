"""The invariance-aware protocol: T is trained on the front model's IRIs of the training split."""

from __future__ import annotations

from stitchsim.models import IRIStats, Spec
from stitchsim_worker.engine.core.context import Cut, JobContext
from stitchsim_worker.engine.core.progress import Units, Work
from stitchsim_worker.engine.iri import synthesis as iri
from stitchsim_worker.engine.protocols.entry import (
    ProtocolImpl,
    TrainSplitFn,
    register_protocol,
)
from stitchsim_worker.engine.stitching.activations import InputSet, Split, train_split

IRI_STEP_UNITS = 3
"""A step is a forward and a backward of the front part on an IRI batch: about three units."""


def iri_units(spec: Spec, n: int) -> int:
    """Planned at the cap (every extra round run, every sample to the end): the progress span
    gives back what the samples did not need when they stop, so the bar never waits at 100 %
    in an extra round."""
    steps = sum(iri.round_lengths(spec.iri))
    return max(1, round(IRI_STEP_UNITS * steps * n / spec.iri.batch_size))


def iri_stage(model: str, point: str) -> str:
    """The stage IRIs of a model's point show in: a step of their own (fitting.protocol_steps,
    measuring.measure_steps)."""
    return f"iri {model} {point}"


def _iris(ctx: JobContext, cut: Cut, inputs: InputSet, key: str, units: int
          ) -> iri.IRIResult:
    """The front model's IRIs of the training inputs at i, from the cache when it holds
    `key`; `units` is their planned work (iri_units)."""
    settings = ctx.spec.iri

    def on_step(live: int) -> None:
        ctx.check_cancel()
        ctx.tracker.step(live)

    # A step costs as much as the samples still being stepped (the converged ones have left
    # the batch), its weight such that every sample-step of the cap sums to `units` exactly
    # (stepped or given back): the bar counts down to the end, never past it. A cache hit
    # takes no steps: the span gives its units back at once.
    weight = units / (settings.max_steps * inputs.pixels.n)
    with ctx.tracker.span(units, weight=weight):
        result = iri.get_iris(
            key=key, cache=ctx.iri_cache, front=cut.f.front(cut.i), pixels=inputs.pixels,
            settings=settings, banks=ctx.banks, device=ctx.device, on_step=on_step,
            on_skip=ctx.tracker.skip,
        )
    stats = result.stats
    if not stats.converged:
        ctx.warnings.append(
            f"IRIs of the {cut.f.where} model at {cut.i} did not converge: median relative "
            f"distance {stats.median:.3f} (from {stats.start_median:.3f}; the line is "
            f"{settings.converged_below:g}); raise iri.steps or iri.step_size"
        )
    return result


def invariance_aware_split(spec: Spec, n: int) -> Work[TrainSplitFn]:
    """The front model's IRIs of the n training inputs, then both models over them."""
    extract, iri_work = train_split(n), iri_units(spec, n)

    def run(ctx: JobContext, cut: Cut, inputs: InputSet, points: list[str]
            ) -> tuple[Split, IRIStats | None]:
        key = iri.cache_key(ctx.identity(cut.f), cut.i, inputs.digest, ctx.spec.iri)
        result = _iris(ctx, cut, inputs, key, iri_work)
        # The IRIs' key names them: the same key, the same IRIs (on one device type).
        return (extract.run(ctx, cut, result.images, inputs.labels, points, f"iri:{key}"),
                result.stats)

    return Work(extract.units + Units(iri=iri_work), run)


register_protocol(ProtocolImpl(
    name="invariance_aware", train_split=invariance_aware_split, split_stage=iri_stage,
))
