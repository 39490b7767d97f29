"""Fitting the stitch layer for one objective: closed form for dm, Adam for the others.

Inputs and targets come from banks computed once per job (the models are frozen and the data
is not augmented), so each step runs only T and the back part g_{>j}.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from stitchsim.models import Objective, TrainSettings
from stitchsim_worker.engine.bank import Bank, batches
from stitchsim_worker.engine.errors import JobCancelled
from stitchsim_worker.engine.metrics import relative_distance
from stitchsim_worker.engine.split import BackPart
from stitchsim_worker.engine.stitch import LeastSquares, StitchLayer


@dataclass
class Split:
    """One split as the stitch sees it: its inputs, and what the back model made of them."""

    inputs: Bank  # f<=i(x) (or of IRIs)
    labels: torch.Tensor
    back_logits: Bank  # g(x)
    back_feats: list[Bank] = field(default_factory=list)  # g_j(x), then g_l(x) for later l
    pixels: Bank | None = None  # only when the back part runs on the hook path

    def __len__(self) -> int:
        return self.inputs.n


@dataclass
class Fit:
    train_loss: float
    test_logits: torch.Tensor


StepFn = Callable[[], None]


def _hard_labels(
    logits: torch.Tensor, _g: torch.Tensor, labels: torch.Tensor, _f: list, _t: list
) -> torch.Tensor:
    return F.cross_entropy(logits, labels)


def _soft_labels(
    logits: torch.Tensor, g_logits: torch.Tensor, _l: torch.Tensor, _f: list, _t: list
) -> torch.Tensor:
    # KL(softmax g || softmax h), temperature 1.
    return F.kl_div(
        logits.log_softmax(-1), g_logits.log_softmax(-1), log_target=True, reduction="batchmean"
    )


def _latent_alignment(
    _h: torch.Tensor, _g: torch.Tensor, _l: torch.Tensor, h_feats: list, g_feats: list
) -> torch.Tensor:
    # Equal weights over l = j .. last stage; no logits term.
    return torch.stack(
        [relative_distance(h, g) for h, g in zip(h_feats, g_feats, strict=True)]
    ).mean()


LOSSES = {"hlm": _hard_labels, "slm": _soft_labels, "fula": _latent_alignment}


def _device_batch(split: Split, idx: torch.Tensor, device: torch.device) -> tuple:
    pixels = split.pixels[idx].to(device) if split.pixels is not None else None
    return split.inputs[idx].to(device), pixels


def init_least_squares(
    stitch: StitchLayer, split: Split, n: int, batch_size: int, device: torch.device
) -> None:
    """Closed-form fit of T towards g_j on the first n samples (all of them for dm)."""
    ls = LeastSquares(stitch)
    for idx in batches(min(n, len(split)), batch_size):
        ls.add(split.inputs[idx].to(device), split.back_feats[0][idx].to(device))
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


def train_stitch(
    stitch: StitchLayer,
    back: BackPart,
    objective: Objective,
    split: Split,
    settings: TrainSettings,
    seed: int,
    device: torch.device,
    on_step: StepFn,
    should_cancel: Callable[[], bool],
) -> float:
    """Adam with step decay x0.1 at 1/3 and 2/3 of training; returns the last epoch's mean loss."""
    loss_fn = LOSSES[objective]
    n = len(split)
    steps = settings.epochs * math.ceil(n / settings.batch_size)
    opt = torch.optim.Adam(stitch.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    sched = torch.optim.lr_scheduler.MultiStepLR(
        opt, milestones=[steps // 3, 2 * steps // 3], gamma=0.1
    )
    gen = torch.Generator().manual_seed(seed)
    last = 0.0
    for _ in range(settings.epochs):
        total, count = 0.0, 0
        for idx in batches(n, settings.batch_size, gen):
            if should_cancel():
                raise JobCancelled()
            a, pixels = _device_batch(split, idx, device)
            z = stitch(a)
            logits, later = back(z, pixels)
            g_feats = [b[idx].to(device) for b in split.back_feats] if objective == "fula" else []
            loss = loss_fn(
                logits,
                split.back_logits[idx].to(device),
                split.labels[idx].to(device),
                [z, *later],
                g_feats,
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
            count += len(idx)
            on_step()
        last = total / count
    return last


@torch.no_grad()
def stitched_logits(
    stitch: StitchLayer, back: BackPart, split: Split, batch_size: int, device: torch.device
) -> torch.Tensor:
    out = []
    for idx in batches(len(split), batch_size):
        a, pixels = _device_batch(split, idx, device)
        logits, _ = back(stitch(a), pixels)
        out.append(logits.float().cpu())
    return torch.cat(out)
