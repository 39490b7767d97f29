"""The work units of a job's pieces (one unit ~ one batch through a network part), counted
the way the engine reports them as it runs: the progress plan and the compute budget add
these up (plan.py), and each control prices its own run with them (controls.py). A count
here that the run does not report, or a report with no count here, shows as an ETA that
is wrong at the end of the job; tests/engine/test_progress_accounting.py holds the two equal.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from stitchsim import catalogue
from stitchsim.models import Spec
from stitchsim_worker.engine.job.context import EVAL_BATCH
from stitchsim_worker.engine.job.progress import Units
from stitchsim_worker.engine.protocols import PROTOCOLS
from stitchsim_worker.engine.protocols.attacks import attack_passes
from stitchsim_worker.engine.stitching.objectives import OBJECTIVES


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


def fit_units(spec: Spec, n_train: int, tests: Sequence[int], *, augmented: bool = False,
              robust: bool = False) -> Units:
    """Every objective and seed fitted on n_train inputs and its stitched model run on each
    test split; an augmented fit crafts PGD inputs in every training batch, and a robust one
    attacks the stitched model on the first test split."""
    adv = spec.adversarial.steps
    units = Units()
    for objective in spec.objectives:
        batches = OBJECTIVES[objective].cost(n_train, spec.train)
        per_seed = Units(train=batches, forward=sum(passes(n, EVAL_BATCH) for n in tests))
        if augmented:
            per_seed += Units(augment=adv * batches)
        if robust:
            per_seed += Units(attack=attack_passes(spec.adversarial)
                              * passes(tests[0], EVAL_BATCH))
        units += per_seed * spec.train.seeds
    return units


def rows_units(spec: Spec, sizes: Sizes, n_train: int, tests: Sequence[int], *,
               control: bool = False) -> Units:
    """fitting.protocol_rows for one cut: each protocol's training split, then its fits."""
    total = Units()
    for protocol in spec.protocols:
        entry = PROTOCOLS[protocol]
        if control and not catalogue.PROTOCOLS[protocol].in_controls:
            continue
        n_fit, own = n_train, list(tests)
        if entry.test_split is not None:  # its own data, and its own test split
            n_fit = sizes.front_train or sizes.train
            own = [sizes.front_test or sizes.test] * len(tests)
            total += Units(forward=passes(own[0], EVAL_BATCH))
        total += entry.cost(spec, n_fit)
        robust = spec.adversarial.evaluate and not control and entry.test_split is None
        # An attacking protocol fits once per alpha (alpha 0: the clean arm, no augment).
        alphas = spec.adversarial.alpha_list() if entry.augment is not None else [0.0]
        for alpha in alphas:
            total += fit_units(spec, n_fit, own, augmented=alpha > 0, robust=robust)
    return total


def test_split_units(sizes: Sizes) -> Units:
    """splits.test_split: the front part over the test split."""
    return Units(forward=passes(sizes.test, EVAL_BATCH))
