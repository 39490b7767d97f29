"""Fitting machinery for the stitch layer: the closed-form least-squares fit and the Adam loop.

Inputs and targets come from banks computed once per job (the models are frozen and the data
is not augmented), so each step runs only T and the back part g_{>j}. What is optimised is the
objective's business (objectives.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from stitchsim.models import TrainSettings
from stitchsim_worker.engine.core.bank import batches
from stitchsim_worker.engine.core.errors import JobCancelled
from stitchsim_worker.engine.models.cutting import BackPart
from stitchsim_worker.engine.stitching.activations import Split
from stitchsim_worker.engine.stitching.layer import LeastSquares, StitchLayer


class LossInputs(NamedTuple):
    """One minibatch as an objective sees it."""

    logits: torch.Tensor  # h(x)
    back_logits: torch.Tensor  # g(x)
    labels: torch.Tensor
    feats: list[torch.Tensor]  # h_l(x) at the alignment points: T(a) first, then later ones
    back_feats: list[torch.Tensor]  # g_l(x) at the same points (empty unless asked for)
    output: str = "logits"  # the back model's output kind (what output matching compares)


LossFn = Callable[[LossInputs], torch.Tensor]


class Batch(NamedTuple):
    """One minibatch of a split on the device."""

    inputs: torch.Tensor  # f<=i(x)
    pixels: torch.Tensor | None  # x, when something needs it
    back_logits: torch.Tensor
    labels: torch.Tensor
    back_feats: list[torch.Tensor]  # g_l(x) at the alignment points (when asked for)


Augment = Callable[[StitchLayer, BackPart, Batch], Batch]
"""Rewrites a training batch against the current stitch (adversarial stitch training)."""


@dataclass
class FitTask:
    """One stitch layer to fit on one split (one seed)."""

    stitch: StitchLayer
    back: BackPart
    split: Split
    settings: TrainSettings
    seed: int
    device: torch.device
    on_step: Callable[[int], None]
    should_cancel: Callable[[], bool]
    augment: Augment | None = None
    output: str = "logits"
    """The back model's output kind: the objectives that match outputs match it its way."""


def _batch(
    split: Split, idx: torch.Tensor, device: torch.device, *, pixels: bool, feats: bool
) -> Batch:
    x = None
    if pixels:
        assert split.pixels is not None, "this batch needs the split's network input"
        x = split.pixels[idx].to(device)
    return Batch(
        inputs=split.inputs[idx].to(device),
        pixels=x,
        back_logits=split.back_logits[idx].to(device),
        labels=split.labels[idx].to(device),
        back_feats=[b[idx].to(device) for b in split.back_feats] if feats else [],
    )


def _task_batch(task: FitTask, idx: torch.Tensor, feats: bool) -> Batch:
    # Only a back part on the hook path reads the network input (and an augmentation that
    # crafts new inputs); the graph path never does.
    batch = _batch(task.split, idx, task.device, feats=feats or task.augment is not None,
                   pixels=task.back.needs_input or task.augment is not None)
    if task.augment is not None:
        batch = task.augment(task.stitch, task.back, batch)
    return batch


def init_least_squares(
    stitch: StitchLayer, split: Split, n: int, batch_size: int, device: torch.device
) -> None:
    """Closed-form fit of T towards g_j on the first n samples (all of them for dm)."""
    ls = LeastSquares(stitch)
    for idx in batches(min(n, len(split)), batch_size):
        ls.add(split.inputs[idx].to(device), split.back_feats[0][idx].to(device))
    ls.solve()


def refit_least_squares(task: FitTask, batch_size: int) -> None:
    """The closed form again, on batches rewritten against the current T (one round of
    adversarial inputs for dm, whose optimum has no training loop to put them into)."""
    ls = LeastSquares(task.stitch)
    for idx in batches(len(task.split), batch_size):
        if task.should_cancel():
            raise JobCancelled()
        b = _task_batch(task, idx, feats=True)
        ls.add(b.inputs, b.back_feats[0])
    ls.solve()


@torch.no_grad()
def direct_matching_loss(
    stitch: StitchLayer, split: Split, batch_size: int, device: torch.device
) -> float:
    """d(T(a), g_j) over the whole split, accumulated batch by batch."""
    num = den = 0.0
    for idx in batches(len(split), batch_size):
        b = split.back_feats[0][idx].to(device)
        num += float(((stitch(split.inputs[idx].to(device)) - b) ** 2).sum())
        den += float((b**2).sum())
    return math.sqrt(num) / max(math.sqrt(den), 1e-12)


def train_stitch(task: FitTask, loss_fn: LossFn, with_feats: bool) -> float:
    """Adam with step decay x0.1 at 1/3 and 2/3 of training; returns the last epoch's mean loss.
    with_feats: the loss compares tensors at the alignment points, not only logits."""
    settings, n = task.settings, len(task.split)
    steps = settings.epochs * math.ceil(n / settings.batch_size)
    opt = torch.optim.Adam(
        task.stitch.parameters(), lr=settings.lr, weight_decay=settings.weight_decay
    )
    sched = torch.optim.lr_scheduler.MultiStepLR(
        opt, milestones=[steps // 3, 2 * steps // 3], gamma=0.1
    )
    gen = torch.Generator().manual_seed(task.seed)
    last = 0.0
    for _ in range(settings.epochs):
        total, count = 0.0, 0
        for idx in batches(n, settings.batch_size, gen):
            if task.should_cancel():
                raise JobCancelled()
            b = _task_batch(task, idx, with_feats)
            z = task.stitch(b.inputs)
            logits, later = task.back(z, b.pixels)
            loss = loss_fn(LossInputs(logits=logits, back_logits=b.back_logits,
                                      labels=b.labels, feats=[z, *later],
                                      back_feats=b.back_feats if with_feats else [],
                                      output=task.output))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
            count += len(idx)
            task.on_step(1)
        last = total / count
    return last


@torch.no_grad()
def stitched_logits(
    stitch: StitchLayer, back: BackPart, split: Split, batch_size: int, device: torch.device,
    on_batch: Callable[[int], None] | None = None,
) -> torch.Tensor:
    out = []
    for idx in batches(len(split), batch_size):
        b = _batch(split, idx, device, pixels=back.needs_input, feats=False)
        logits, _ = back(stitch(b.inputs), b.pixels)
        out.append(logits.float().cpu())
        if on_batch is not None:
            on_batch(1)
    return torch.cat(out)
