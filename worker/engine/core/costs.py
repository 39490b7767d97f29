"""The sizes a job's work is counted from, and the models' size factor of its budget. Each
piece of work counts its own units beside the code that does it (the steps of plan.py); this
module holds only what they all count with."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Sizes:
    """The split sizes a job runs on, and its number of stitch pairs. cross_task fits on the
    front model's own data; where that is not known yet (the spec check), its sizes are taken
    to be the comparison's."""

    train: int
    test: int
    pairs: int
    front_train: int | None = None
    front_test: int | None = None
    probes: tuple[int, ...] = ()
    """Each probe set's test split (spec.probes)."""


REFERENCE_FLOPS = 74e6
"""One sample's forward pass through timm's resnet18 on 32x32 inputs, in floating-point
operations: the model size one budget unit stands for."""


def size_factor(front_flops: float, back_flops: float) -> float:
    """Budget units per batch of work for these two models: their mean forward cost a sample
    against REFERENCE_FLOPS, and never below 1 (a batch through a small model still costs a
    batch's overheads). A job's progress counts batches; its budget counts them at this size,
    so a large architecture cannot hide behind a small spec."""
    return max(1.0, (front_flops + back_flops) / 2 / REFERENCE_FLOPS)


def passes(n: int, batch_size: int) -> int:
    """Batches in one pass over n samples."""
    return math.ceil(n / batch_size)
