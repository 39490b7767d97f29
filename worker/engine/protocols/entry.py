"""What a protocol is (docs/method.md): one registered entry each, saying what the stitch is
trained on.

An entry turns a run's training inputs into the split T is fitted on (and the figures that
describe how it was made, such as IRI convergence): one function of the spec and the number
of inputs that returns that work with the units it takes (core.progress.Work). Every
protocol is evaluated on the normal test split unless it brings its own. What a protocol is
called, its rank for the verdict and its flags (uses IRIs, runs in the controls,
needs the front model's dataset ...) are its catalogue entry's (stitchsim.catalogue.PROTOCOLS).
Adding a protocol is its catalogue entry plus one `register_protocol` call, in a module of
this package (the package finds its modules; the order is the catalogue's), under the same
name; registering checks the catalogue's flags against what the implementation does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from stitchsim import catalogue
from stitchsim.models import IRIStats, Protocol, Spec
from stitchsim_worker.engine.core.context import Cut, JobContext
from stitchsim_worker.engine.core.progress import Work
from stitchsim_worker.engine.core.registry import Registry, check_flag
from stitchsim_worker.engine.models.cutting import BackPart
from stitchsim_worker.engine.stitching.activations import InputSet, Split, SplitFn
from stitchsim_worker.engine.stitching.layer import StitchLayer
from stitchsim_worker.engine.stitching.train import Augment

TrainSplitFn = Callable[[JobContext, Cut, InputSet, list[str]], tuple[Split, IRIStats | None]]


@dataclass(frozen=True)
class ProtocolImpl:
    name: Protocol
    train_split: Callable[[Spec, int], Work[TrainSplitFn]]
    """(spec, n training inputs) -> making the split to fit T on, with its units: (ctx, cut,
    training inputs, back alignment points) -> the split, and its stats."""
    augment: Callable[[JobContext, Cut, list[str], float], Augment] | None = None
    """(ctx, cut, back alignment points, alpha) -> what rewrites each training batch against
    the stitch being trained (adversarial; alpha is the share of the batch it attacks)."""
    test_split: Callable[[int], Work[SplitFn]] | None = None
    """(n test inputs) -> making its own test split, when it is not the comparison's
    (cross-task pairing), with its units."""
    split_stage: Callable[[str, str], str] | None = None
    """(model, point) of the cut's front part -> the stage its training split shows in, a
    step of its own (the IRIs'); None: the split goes on in the stage before it."""


PROTOCOL_IMPLS: Registry[ProtocolImpl] = Registry("protocol")


def register_protocol(impl: ProtocolImpl) -> ProtocolImpl:
    """Registers a protocol's implementation under its catalogue name, once its catalogue
    flags say what it does: it attacks while training exactly when it has an augment, and runs
    in the controls exactly when it tests on the comparison's test split."""
    flags = catalogue.PROTOCOLS[impl.name]
    check_flag("protocol", impl.name, "attacks", flags.attacks, impl.augment is not None,
               "has an augment")
    check_flag("protocol", impl.name, "in_controls", flags.in_controls, impl.test_split is None,
               "tests on the comparison's test split")
    check_flag("protocol", impl.name, "uses_iris", flags.uses_iris, impl.split_stage is not None,
               "has a stage of its own for its split (the IRIs')")
    return PROTOCOL_IMPLS.register(impl)


def stitched(cut: Cut, stitch: StitchLayer, back: BackPart) -> Callable[[torch.Tensor],
                                                                         torch.Tensor]:
    """h = g>j . T . f<=i on pixels (the hook path's back part reads the same pixels)."""
    front = cut.f.front(cut.i)
    return lambda x: back(stitch(front(x)), x)[0]
