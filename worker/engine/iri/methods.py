"""The IRI methods (catalogue.IRI_METHODS): one registered entry each, under the catalogue's
name. A method is a preset of the IRI settings (the spec fills the fields it leaves unset from
the catalogue entry), so every entry runs the one generator, synthesis.synthesize, with the
job's effective settings: a field set in the spec over a method changes that method's run the
same way for every method. An entry that needs a step of its own would bring its generator
here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from stitchsim.models import IRIMethod, IRISettings
from stitchsim_worker.engine.iri.synthesis import Synthesis, synthesize
from stitchsim_worker.engine.registry import Registry
from stitchsim_worker.engine.stitching.bank import Bank, BankBuilder

Generator = Callable[
    [Callable[[torch.Tensor], torch.Tensor], Bank, IRISettings, BankBuilder, torch.device,
     Callable[[int], None]],
    Synthesis,
]


@dataclass(frozen=True)
class IRIMethodEntry:
    name: IRIMethod
    generate: Generator
    """(front up to the point, training pixels, effective settings, banks, device, on_step)
    -> the IRIs and their per-sample distances and steps."""


IRI_METHODS: Registry[IRIMethodEntry] = Registry("IRI method")
register_iri_method = IRI_METHODS.register

register_iri_method(IRIMethodEntry("paper", synthesize))
register_iri_method(IRIMethodEntry("fast", synthesize))
