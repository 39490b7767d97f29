"""The alignment objectives (docs/method.md), one registered entry each.

An entry says how T is fitted (a loss for Adam, or a closed form): one function of the
number of training samples and the settings that returns the fit with the units it takes.
What an objective is called, and its flags (which of the back model's tensors it needs), are
its catalogue entry's (stitchsim.catalogue.OBJECTIVES). Adding an objective is
its catalogue entry plus one `register_objective` call here, under the same name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from stitchsim import catalogue
from stitchsim.models import Objective, TrainSettings
from stitchsim_worker.engine.core.costs import passes
from stitchsim_worker.engine.core.progress import Units, Work
from stitchsim_worker.engine.core.registry import Registry, check_flag
from stitchsim_worker.engine.measures.metrics import relative_distance
from stitchsim_worker.engine.measures.outputs import OUTPUTS
from stitchsim_worker.engine.stitching.train import (
    FitTask,
    LossFn,
    LossInputs,
    direct_matching_loss,
    init_least_squares,
    refit_least_squares,
    train_stitch,
)

LS_BATCH = 256

FitFn = Callable[[FitTask], float]


@dataclass(frozen=True)
class ObjectiveImpl:
    name: Objective
    fit: Callable[[int, TrainSettings], Work[FitFn]]
    """(n training samples, settings) -> a fit of task.stitch on task.split (initialised or
    not) that returns the training loss, with its units (batches through T and g>j)."""
    with_feats: bool = False
    """Its loss reads the back model's tensors at j and every later stage, not just at j (the
    split carries them: its catalogue entry aligns later points)."""


OBJECTIVE_IMPLS: Registry[ObjectiveImpl] = Registry("objective")


def register_objective(impl: ObjectiveImpl) -> ObjectiveImpl:
    """Registers an objective's implementation under its catalogue name, once its catalogue
    flag says what its loss reads: later points exactly when it trains with their tensors."""
    check_flag("objective", impl.name, "aligns_later_points",
               catalogue.OBJECTIVES[impl.name].aligns_later_points, impl.with_feats,
               "trains on the later points' tensors")
    return OBJECTIVE_IMPLS.register(impl)


# ---------------------------------------------------------------- losses


def hard_label_loss(b: LossInputs) -> torch.Tensor:
    return F.cross_entropy(b.logits, b.labels)


def soft_label_loss(b: LossInputs) -> torch.Tensor:
    """Matching the back model's outputs, as its output kind matches them: KL between the
    softmaxes for logits (temperature 1), the kind's own loss for embeddings and images."""
    return OUTPUTS[b.output].match(b.logits, b.back_logits)


def latent_alignment_loss(b: LossInputs) -> torch.Tensor:
    # Equal weights over l = j .. last stage; no logits term.
    return torch.stack(
        [relative_distance(h, g) for h, g in zip(b.feats, b.back_feats, strict=True)]
    ).mean()


# ---------------------------------------------------------------- fitting


def _trained(name: Objective, loss: LossFn, with_feats: bool = False) -> ObjectiveImpl:
    """An objective trained with Adam on its loss."""
    return ObjectiveImpl(name=name, fit=_adam(loss, with_feats), with_feats=with_feats)


def _adam(loss: LossFn, with_feats: bool) -> Callable[[int, TrainSettings], Work[FitFn]]:
    """Least-squares initialisation on `init_samples`, then Adam on the loss: every epoch's
    batches (train_stitch reports each)."""

    def plan(n: int, settings: TrainSettings) -> Work[FitFn]:
        def fit(task: FitTask) -> float:
            init_least_squares(task.stitch, task.split, task.settings.init_samples, LS_BATCH,
                               task.device)
            return train_stitch(task, loss, with_feats)

        return Work(Units(train=settings.epochs * passes(n, settings.batch_size)), fit)

    return plan


def _closed_form(n: int, _settings: TrainSettings) -> Work[FitFn]:
    """dm's optimum for a linear T is the least-squares solution over the whole split (with
    adversarial stitch training: solved again on inputs attacked against that solution),
    counted as one pass of least-squares batches."""
    units = passes(n, LS_BATCH)

    def fit(task: FitTask) -> float:
        init_least_squares(task.stitch, task.split, len(task.split), LS_BATCH, task.device)
        if task.augment is not None:
            refit_least_squares(task, LS_BATCH)
        loss = direct_matching_loss(task.stitch, task.split, LS_BATCH, task.device)
        task.on_step(units)
        return loss

    return Work(Units(train=units), fit)


register_objective(_trained("hlm", hard_label_loss))
register_objective(_trained("slm", soft_label_loss))
register_objective(ObjectiveImpl(name="dm", fit=_closed_form))
register_objective(_trained("fula", latent_alignment_loss, with_feats=True))
