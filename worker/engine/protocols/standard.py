"""The standard protocol: T is trained on the training split."""

from __future__ import annotations

import math

from stitchsim.models import IRIStats, Spec
from stitchsim_worker.engine.core.context import EVAL_BATCH, Cut, JobContext
from stitchsim_worker.engine.core.progress import Units
from stitchsim_worker.engine.protocols.entry import (
    ProtocolImpl,
    register_protocol,
)
from stitchsim_worker.engine.stitching.activations import InputSet, Split, train_split


def standard_split(
    ctx: JobContext, cut: Cut, inputs: InputSet, points: list[str]
) -> tuple[Split, IRIStats | None]:
    return train_split(ctx, cut, inputs.pixels, inputs.labels, points, inputs.digest), None


def extraction_units(_spec: Spec, n: int) -> Units:
    """train_split: the back model's probe and the front part, one pass each."""
    return Units(forward=2 * math.ceil(n / EVAL_BATCH))


register_protocol(ProtocolImpl(
    name="standard", train_split=standard_split, cost=extraction_units,
))
