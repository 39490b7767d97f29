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

import torch
import torch.nn.functional as F
from stitchsim.models import IRISettings, IRIStats, Protocol, Spec
from stitchsim_worker.engine import iri
from stitchsim_worker.engine.attacks import pgd
from stitchsim_worker.engine.bank import Bank
from stitchsim_worker.engine.context import EVAL_BATCH, Cut, JobContext
from stitchsim_worker.engine.errors import SpecError
from stitchsim_worker.engine.progress import Units
from stitchsim_worker.engine.registry import Registry
from stitchsim_worker.engine.split import BackPart
from stitchsim_worker.engine.splits import InputSet, Split, train_split
from stitchsim_worker.engine.stitch import StitchLayer
from stitchsim_worker.engine.train import Augment, Batch

TrainSplitFn = Callable[[JobContext, Cut, InputSet, list[str]], tuple[Split, IRIStats | None]]


@dataclass(frozen=True)
class ProtocolEntry:
    name: Protocol
    label: str
    description: str
    train_split: TrainSplitFn
    """(ctx, cut, training inputs, back alignment points) -> split to fit T on, and stats."""
    cost: Callable[[Spec, int], Units]
    """Work units its training split of n inputs takes (the fits are costs.fit_units)."""
    augment: Callable[[JobContext, Cut, list[str]], Augment] | None = None
    """Rewrites each training batch against the stitch being trained (adversarial)."""
    test_split: Callable[[JobContext, Cut], Split] | None = None
    """Its own test split, when it is not the comparison's (cross-task pairing)."""
    in_controls: bool = True
    """Whether the controls (identity, shortcut) run it too."""


PROTOCOLS: Registry[ProtocolEntry] = Registry("protocol")
register_protocol = PROTOCOLS.register


# ---------------------------------------------------------------- standard


def _standard(
    ctx: JobContext, cut: Cut, inputs: InputSet, points: list[str]
) -> tuple[Split, IRIStats | None]:
    return train_split(ctx, cut, inputs.pixels, inputs.labels, points), None


def _extraction(_spec: Spec, n: int) -> Units:
    """train_split: the back model's probe and the front part, one pass each."""
    return Units(forward=2 * math.ceil(n / EVAL_BATCH))


register_protocol(ProtocolEntry(
    name="standard", label="standard",
    description="T is trained on the training split, towards the back model's processing of it",
    train_split=_standard, cost=_extraction,
))


# ---------------------------------------------------------------- invariance-aware


IRI_STEP_UNITS = 3
"""A step is a forward and a backward of the front part on an IRI batch: about three units."""


def iri_units(spec: Spec, n: int) -> int:
    """Planned at the cap (every extra round run, every sample to the end): the progress span
    gives back what the samples did not need when they stop, so the bar never waits at 100 %
    in an extra round."""
    steps = sum(iri.round_lengths(spec.iri))
    return max(1, round(IRI_STEP_UNITS * steps * n / spec.iri.batch_size))


def round_ends(settings: IRISettings) -> list[float]:
    """The share of the IRIs' cap at the end of each round: where a set of IRIs may stop."""
    lengths = iri.round_lengths(settings)
    return [sum(lengths[: r + 1]) / sum(lengths) for r in range(len(lengths))]


def _iris(ctx: JobContext, cut: Cut, inputs: InputSet) -> iri.IRIResult:
    """The front model's IRIs of the training inputs at i, from the cache when it has them."""
    settings = ctx.spec.iri
    ctx.tracker.enter(f"iri {cut.f.where} {cut.i}")
    key = iri.cache_key(ctx.identity(cut.f), cut.i, inputs.digest, settings)

    def on_step(live: int) -> None:
        ctx.check_cancel()
        ctx.tracker.step(live)

    # A step costs as much as the samples still being stepped (the converged ones have left
    # the batch). A cache hit takes no steps: the span gives its units back at once.
    with ctx.tracker.span(iri_units(ctx.spec, inputs.pixels.n),
                          weight=IRI_STEP_UNITS / settings.batch_size, marks=round_ends(settings)):
        result = iri.get_iris(
            key=key, cache=ctx.iri_cache, front=cut.f.front(cut.i), pixels=inputs.pixels,
            settings=settings, banks=ctx.banks, device=ctx.device, on_step=on_step,
        )
    stats = result.stats
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


def _iris_and_extraction(spec: Spec, n: int) -> Units:
    return _extraction(spec, n) + Units(iri=iri_units(spec, n))


register_protocol(ProtocolEntry(
    name="invariance_aware", label="invariance-aware",
    description="T is trained on IRIs: inputs the front model cannot tell from the training "
    "inputs at the stitch point, towards the back model's own processing of the IRIs",
    train_split=_invariance_aware, cost=_iris_and_extraction,
))


# ---------------------------------------------------------------- adversarial


def stitched(cut: Cut, stitch: StitchLayer, back: BackPart) -> Callable[[torch.Tensor],
                                                                         torch.Tensor]:
    """h = g>j . T . f<=i on pixels (the hook path's back part reads the same pixels)."""
    front = cut.f.front(cut.i)
    return lambda x: back(stitch(front(x)), x)[0]


def _adversarial_augment(ctx: JobContext, cut: Cut, points: list[str]) -> Augment:
    """A fraction alpha of each batch becomes PGD inputs crafted against the stitched model,
    with the front part's view and the back model's targets recomputed on them."""
    settings = ctx.spec.adversarial
    front, probe = cut.f.front(cut.i), cut.g.probe(points)
    gen = torch.Generator().manual_seed(settings.seed)

    def augment(stitch: StitchLayer, back: BackPart, b: Batch) -> Batch:
        k = round(settings.alpha * len(b.labels))
        if k == 0:
            return b
        assert b.pixels is not None
        sel = torch.randperm(len(b.labels), generator=gen)[:k].to(b.labels.device)
        h, labels = stitched(cut, stitch, back), b.labels[sel]
        x_adv = pgd(lambda x: F.cross_entropy(h(x), labels, reduction="sum"), b.pixels[sel],
                    settings, gen)
        with torch.no_grad():
            a_adv = front(x_adv)
            g_logits, *g_feats = probe(x_adv)
        ctx.tracker.step(settings.steps, "augment")

        def swap(t: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
            t = t.clone()
            t[sel] = new.to(t.dtype)
            return t

        return Batch(
            inputs=swap(b.inputs, a_adv), pixels=swap(b.pixels, x_adv),
            back_logits=swap(b.back_logits, g_logits), labels=b.labels,
            back_feats=[swap(t, f) for t, f in zip(b.back_feats, g_feats, strict=False)],
        )

    return augment


register_protocol(ProtocolEntry(
    name="adversarial", label="adversarial",
    description="T is trained on the training split with a fraction alpha of each batch "
    "replaced by PGD inputs crafted against the stitched model, towards the back model's "
    "processing of the same adversarial inputs",
    train_split=_standard, cost=_extraction, augment=_adversarial_augment,
))


# ---------------------------------------------------------------- cross-task pairing

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
            raise SpecError(f"cross_task: the back model's dataset has no {split_name} sample "
                            f"of class {int(c)}, which front class(es) are paired with")
        where = (labels == c).nonzero().flatten()
        partner[where] = pool[torch.randint(0, len(pool), (len(where),), generator=g)]
    pixels = ctx.own_pixels[cut.f.where][0 if split_name == "train" else 1]
    return labels, pixels, ctx.bank(theirs.images[partner])


def _one_hot_logits(ctx: JobContext, labels: torch.Tensor, k: int) -> Bank:
    logits = torch.full((len(labels), k), _ELSEWHERE)
    logits[torch.arange(len(labels)), labels] = 0.0
    return ctx.bank(logits)


def _cross_task_train(
    ctx: JobContext, cut: Cut, _inputs: InputSet, points: list[str]
) -> tuple[Split, IRIStats | None]:
    labels, pixels, partners = _paired(ctx, cut, "train")
    front, probe = cut.f.front(cut.i), cut.g.probe([cut.j])
    (inputs,) = ctx.compute(pixels, lambda x: (front(x),))
    # T's least-squares start maps the front model's view of its own images to the back
    # model's tensor on images of the paired class.
    _, feat = ctx.compute(partners, lambda x: (*probe(x),))
    k = int(cut.g.model.num_classes)
    return Split(inputs, labels, _one_hot_logits(ctx, labels, k), [feat], partners), None


def _cross_task_test(ctx: JobContext, cut: Cut) -> Split:
    labels, pixels, partners = _paired(ctx, cut, "test")
    front = cut.f.front(cut.i)
    (inputs,) = ctx.compute(pixels, lambda x: (front(x),))
    own = ctx.prep.data_of(cut.g).test
    g_right = ctx.own_test_logits[cut.g.where].all().argmax(-1) == own.labels
    k = int(cut.g.model.num_classes)
    return Split(inputs, labels, _one_hot_logits(ctx, labels, k), [], partners,
                 back_accuracy=float(g_right.float().mean()))


register_protocol(ProtocolEntry(
    name="cross_task", label="cross-task pairing",
    description="front and back models of different tasks: T is trained with the front "
    "model's own images and hard labels paired into the back model's classes; it measures "
    "compatibility, not shared meaning (read it against the clustered-noise floor)",
    train_split=_cross_task_train, cost=_extraction, test_split=_cross_task_test,
    in_controls=False,
))
