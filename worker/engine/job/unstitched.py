"""The endpoint: the two whole models against each other, with no stitch.

Every plot of the invariance-aware paper ends in it (its "Front" point: the stitched network
with the whole front model in it, set against the end model); a stitch that agrees with the
end model far above it took more than the front model's own function. Same test split, same
figures and intervals as the rows (the end model's output kind scores them), once per
direction: the model in front position is h, the model the stitched network ends in is g.
"""

from __future__ import annotations

import torch
from stitchsim.models import UnstitchedRow
from stitchsim_worker.engine.core.bank import Bank
from stitchsim_worker.engine.core.context import JobContext
from stitchsim_worker.engine.measures.outputs import OUTPUTS


def unstitched_rows(ctx: JobContext) -> list[UnstitchedRow]:
    """Per direction of the spec; none when the models' outputs are not in one class space
    (cross-task pairing: the front model answers another task)."""
    if ctx.prep.front_data is not None:
        return []
    return endpoint_rows(ctx, ctx.test_logits, ctx.prep.data.test.labels)


def endpoint_rows(ctx: JobContext, logits: dict[str, Bank], labels: torch.Tensor
                  ) -> list[UnstitchedRow]:
    """Per direction of the spec, on one set of inputs: each model's logits on it by role."""
    seed = ctx.spec.train.seed
    rows = []
    for direction in ctx.spec.direction_list():
        f, g = ctx.networks(direction)
        h_logits, g_logits = logits[f.where].all(), logits[g.where].all()
        if h_logits.shape != g_logits.shape:
            return []
        scored = OUTPUTS[g.output].score(h_logits, g_logits, labels, seed)
        rows.append(UnstitchedRow(direction=direction, output=g.output,
                                  figures=scored.figures(), samples=len(h_logits)))
    return rows
