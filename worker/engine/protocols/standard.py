"""The standard protocol: T is trained on the training split."""

from __future__ import annotations

from stitchsim.models import IRIStats, Spec
from stitchsim_worker.engine.core.context import Cut, JobContext
from stitchsim_worker.engine.core.progress import Work
from stitchsim_worker.engine.protocols.entry import (
    ProtocolImpl,
    TrainSplitFn,
    register_protocol,
)
from stitchsim_worker.engine.stitching.activations import InputSet, Split, train_split


def standard_split(_spec: Spec, n: int) -> Work[TrainSplitFn]:
    """Both models over the n training inputs."""
    extract = train_split(n)

    def run(ctx: JobContext, cut: Cut, inputs: InputSet, points: list[str]
            ) -> tuple[Split, IRIStats | None]:
        return extract.run(ctx, cut, inputs.pixels, inputs.labels, points, inputs.digest), None

    return Work(extract.units, run)


register_protocol(ProtocolImpl(name="standard", train_split=standard_split))
