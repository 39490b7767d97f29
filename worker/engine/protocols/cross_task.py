"""Cross-task pairing: the front model's own task, its classes paired into the back model's."""

from __future__ import annotations

import torch
from stitchsim.catalogue import OUTPUT_KINDS
from stitchsim.failure import Failure
from stitchsim.models import IRIStats, Spec
from stitchsim_worker.engine.core.bank import Bank
from stitchsim_worker.engine.core.context import EVAL_BATCH, Cut, JobContext
from stitchsim_worker.engine.core.costs import passes
from stitchsim_worker.engine.core.progress import Units, Work
from stitchsim_worker.engine.protocols.entry import (
    ProtocolImpl,
    TrainSplitFn,
    register_protocol,
)
from stitchsim_worker.engine.stitching.activations import InputSet, Split, SplitFn

_ELSEWHERE = -30.0  # a logit whose softmax is ~1e-13: one-hot "predictions" of paired labels


def _paired(ctx: JobContext, cut: Cut, split_name: str) -> tuple[torch.Tensor, Bank, Bank]:
    """The front model's own images of one split, their labels paired into the back model's
    classes, and for each a back-task image of the paired class (a random one, fixed by the
    seed): what the back model would see in that class."""
    own, other = ctx.prep.data_of(cut.f), ctx.prep.data_of(cut.g)
    mine = getattr(own, split_name)
    theirs = getattr(other, split_name)
    labels = ctx.prep.classes_into(cut.g)[mine.labels]
    g = torch.Generator().manual_seed(ctx.spec.train.seed)
    partner = torch.empty(len(labels), dtype=torch.long)
    for c in labels.unique():
        pool = (theirs.labels == c).nonzero().flatten()
        if len(pool) == 0:
            raise Failure("invalid_spec",
                          f"cross_task: the back model's dataset has no {split_name} sample "
                          f"of class {int(c)}, which front class(es) are paired with")
        where = (labels == c).nonzero().flatten()
        partner[where] = pool[torch.randint(0, len(pool), (len(where),), generator=g)]
    pixels = ctx.own_pixels[cut.f.where][0 if split_name == "train" else 1]
    return labels, pixels, ctx.bank(theirs.pixels[partner])


def _one_hot_logits(ctx: JobContext, labels: torch.Tensor, k: int) -> Bank:
    logits = torch.full((len(labels), k), _ELSEWHERE)
    logits[torch.arange(len(labels)), labels] = 0.0
    return ctx.bank(logits)


def _cross_task_train(_spec: Spec, n: int) -> Work[TrainSplitFn]:
    """The front model over its n own training images, the back model over as many images of
    the paired classes."""

    def run(ctx: JobContext, cut: Cut, _inputs: InputSet, points: list[str]
            ) -> tuple[Split, IRIStats | None]:
        labels, pixels, partners = _paired(ctx, cut, "train")
        front, probe = cut.f.front(cut.i), cut.g.probe([cut.j])
        (inputs,) = ctx.compute(pixels, lambda x: (front(x),))
        # T's least-squares start maps the front model's view of its own images to the back
        # model's tensor on images of the paired class.
        out, feat = ctx.compute(partners, lambda x: (*probe(x),))
        return Split(inputs, labels, _targets(ctx, cut, labels, out), [feat], partners), None

    return Work(Units(forward=2 * passes(n, EVAL_BATCH)), run)


def _targets(ctx: JobContext, cut: Cut, labels: torch.Tensor, partner_out: Bank) -> Bank:
    """What the stitched model is held to: the paired labels as one-hot "predictions" for a
    classifier; for a model without classes (an autoencoder, an embedder) its own output on
    the paired-class image (an autoencoder stitched across tasks must draw the back task's
    class from the front task's input: Functional Alignment Can Mislead's digits from
    clothes)."""
    if OUTPUT_KINDS[cut.g.output].classes:
        return _one_hot_logits(ctx, labels, int(cut.g.model.num_classes))
    return partner_out


def _cross_task_test(n: int) -> Work[SplitFn]:
    """The front model over its n own test images (the back model's answers are the paired
    labels; for a model without classes, it runs on the paired-class images too, which the
    plan does not count)."""

    def run(ctx: JobContext, cut: Cut) -> Split:
        labels, pixels, partners = _paired(ctx, cut, "test")
        front = cut.f.front(cut.i)
        (inputs,) = ctx.compute(pixels, lambda x: (front(x),))
        if not OUTPUT_KINDS[cut.g.output].classes:
            (out,) = ctx.compute(partners, lambda x: (cut.g.logits(x),))
            return Split(inputs, labels, out, [], partners, front_pixels=pixels)
        own = ctx.prep.data_of(cut.g).test
        g_right = ctx.own_test_logits[cut.g.where].all().argmax(-1) == own.labels
        k = int(cut.g.model.num_classes)
        return Split(inputs, labels, _one_hot_logits(ctx, labels, k), [], partners,
                     back_accuracy=float(g_right.float().mean()))

    return Work(Units(forward=passes(n, EVAL_BATCH)), run)


register_protocol(ProtocolImpl(
    name="cross_task", train_split=_cross_task_train, test_split=_cross_task_test,
))
