"""The data a stitch is trained and evaluated on: the front part's view of the inputs, and the
back model's own processing of the same inputs. Computed once per (stitch, input set): the
models are frozen and nothing is augmented."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from stitchsim_worker.engine.core.bank import Bank
from stitchsim_worker.engine.core.context import EVAL_BATCH, Cut, JobContext, test_inputs
from stitchsim_worker.engine.core.costs import passes
from stitchsim_worker.engine.core.progress import Units, Work


@dataclass
class Split:
    """One split as the stitch sees it: its inputs, and what the back model made of them."""

    inputs: Bank  # f<=i(x) (or of IRIs, or noise for the controls)
    labels: torch.Tensor
    back_logits: Bank  # g(x)
    back_feats: list[Bank] = field(default_factory=list)  # g_j(x), then g_l(x) for later l
    # The network input x itself: a back part on the hook path runs g on x and swaps the
    # stitch tensor in; one on the graph path never reads it.
    pixels: Bank | None = None
    # The back model's accuracy to set the stitched one against, when back_logits are not
    # its own predictions (cross-task pairing: they are the paired labels).
    back_accuracy: float | None = None
    # The images the front part saw, when they are not `pixels` (cross-task pairing: pixels
    # are the back task's paired-class images, these the front task's own).
    front_pixels: Bank | None = None

    def __len__(self) -> int:
        return self.inputs.n


@dataclass(frozen=True)
class InputSet:
    """Training inputs of a protocol run: pixels, labels, and the content identity of both
    (it keys the IRI cache)."""

    pixels: Bank
    labels: torch.Tensor
    digest: str


ExtractFn = Callable[[JobContext, Cut, Bank, torch.Tensor, list[str], str | None], Split]
"""(ctx, cut, pixels, labels, back points, the pixels' identity) -> the split."""
SplitFn = Callable[[JobContext, Cut], Split]
ImagesFn = Callable[[JobContext, Cut, torch.Tensor, torch.Tensor], Split]


def train_split(n: int) -> Work[ExtractFn]:
    """Stitch inputs f<=i(x), the back model's logits and its tensors at `points` (j first)
    over n inputs: a pass of each model. An `identity` names the pixels' content (the
    reference's share is then kept across jobs)."""

    def run(ctx: JobContext, cut: Cut, pixels: Bank, labels: torch.Tensor, points: list[str],
            identity: str | None = None) -> Split:
        probe, front = cut.g.probe(points), cut.f.front(cut.i)
        logits, *feats = ctx.model_compute(cut.g, f"probe {points}", identity, pixels,
                                           lambda x: (*probe(x),))
        (inputs,) = ctx.model_compute(cut.f, f"front {cut.i}", identity, pixels,
                                      lambda x: (front(x),))
        return Split(inputs, labels, logits, feats, pixels)

    return Work(Units(forward=2 * passes(n, EVAL_BATCH)), run)


def test_split(n: int) -> Work[SplitFn]:
    """The test split of n inputs: f<=i(x), a pass of the front part, and g(x) (computed once
    per job, as it opens)."""

    def run(ctx: JobContext, cut: Cut) -> Split:
        front = cut.f.front(cut.i)
        (inputs,) = ctx.model_compute(cut.f, f"front {cut.i}",
                                      test_inputs(ctx.prep.data.digest), ctx.test_pixels,
                                      lambda x: (front(x),))
        data = ctx.prep.data
        return Split(inputs, data.test.labels,
                     ctx.test_logits[cut.g.where], [], ctx.test_pixels)

    return Work(Units(forward=passes(n, EVAL_BATCH)), run)


def probe_split(n: int) -> Work[Callable[[JobContext, Cut, int], Split]]:
    """The k-th probe set's test split of n inputs, as test_split: a pass of the front part
    (the reference's kept across jobs, as for the dataset), the back model's logits from the
    job's opening."""

    def run(ctx: JobContext, cut: Cut, k: int) -> Split:
        probe, front = ctx.prep.probes[k], cut.f.front(cut.i)
        pixels = probe.test.pixels
        (inputs,) = ctx.model_compute(cut.f, f"front {cut.i}", test_inputs(probe.digest),
                                      pixels, lambda x: (front(x),))
        return Split(inputs, probe.test.labels, ctx.probe_logits[k][cut.g.where], [], pixels)

    return Work(Units(forward=passes(n, EVAL_BATCH)), run)


def images_split(n: int) -> Work[ImagesFn]:
    """A test split of n other images (e.g. with markers): a pass of both models on them."""

    def run(ctx: JobContext, cut: Cut, images: torch.Tensor, labels: torch.Tensor) -> Split:
        pixels = ctx.bank(images)
        front = cut.f.front(cut.i)
        (inputs,) = ctx.compute(pixels, lambda x: (front(x),))
        (logits,) = ctx.compute(pixels, lambda x: (cut.g.logits(x),))
        return Split(inputs, labels, logits, [], pixels)

    return Work(Units(forward=2 * passes(n, EVAL_BATCH)), run)


def with_inputs(split: Split, inputs: Bank) -> Split:
    """The same targets, other stitch inputs (the clustered-noise control)."""
    return Split(inputs, split.labels, split.back_logits, split.back_feats, split.pixels)
