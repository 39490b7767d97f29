"""The endpoint: the two whole models against each other, with no stitch.

Every plot of the invariance-aware paper ends in it (its "Front" point: the stitched network
with the whole front model in it, set against the end model); a stitch that agrees with the
end model far above it took more than the front model's own function. Same test split, same
figures and intervals as the rows (metrics.evaluate), once per direction: the model in front
position is h, the model the stitched network ends in is g.
"""

from __future__ import annotations

from stitchsim.models import UnstitchedRow
from stitchsim_worker.engine.job.context import JobContext
from stitchsim_worker.engine.measures.metrics import evaluate


def unstitched_rows(ctx: JobContext) -> list[UnstitchedRow]:
    """Per direction of the spec; none when the models' outputs are not in one class space
    (cross-task pairing: the front model answers another task)."""
    if ctx.prep.front_data is not None:
        return []
    labels, seed = ctx.prep.data.test.labels, ctx.spec.train.seed
    rows = []
    for direction in ctx.spec.direction_list():
        f, g = ctx.networks(direction)
        h_logits, g_logits = ctx.test_logits[f.where].all(), ctx.test_logits[g.where].all()
        if h_logits.shape != g_logits.shape:
            return []
        ev = evaluate(h_logits, g_logits, labels, seed=seed)
        figures = {name: getattr(ev.figures, name) for name in (
            "agreement", "hard_agreement", "correct_agreement", "error_consistency",
            "soft_kappa")}
        rows.append(UnstitchedRow(
            direction=direction, accuracy=ev.figures.accuracy, samples=len(labels),
            **figures, **{f"{k}_ci": ev.ci[k] for k in figures},
        ))
    return rows
