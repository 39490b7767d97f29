"""Objectives, protocols and controls are registered entries (issue 13): the registries are
the engine's one list of them, and they match the contract's enumerations."""

from __future__ import annotations

from typing import get_args

import pytest
from stitchsim.models import Control, Measure, Objective, Protocol
from stitchsim_worker.engine.measures.similarity import MEASURES
from stitchsim_worker.engine.protocols import PROTOCOLS
from stitchsim_worker.engine.protocols.controls import CONTROLS
from stitchsim_worker.engine.stitching.objectives import (
    OBJECTIVES,
    ObjectiveEntry,
    register_objective,
)


@pytest.mark.parametrize(
    ("registry", "names"),
    [(OBJECTIVES, Objective), (PROTOCOLS, Protocol), (CONTROLS, Control),
     (MEASURES, Measure)],
    ids=["objectives", "protocols", "controls", "measures"],
)
def test_every_contract_name_has_exactly_one_entry(registry: dict, names: object) -> None:
    assert list(registry) == list(get_args(names))
    for name, entry in registry.items():
        assert entry.name == name
        assert entry.label and len(entry.description) > 20


def test_an_entry_cannot_be_registered_twice() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        register_objective(ObjectiveEntry(name="slm", label="x", description="x",
                                          fit=lambda task: 0.0, cost=lambda n, s: 0))


def test_closed_form_and_alignment_flags_say_what_the_objectives_need() -> None:
    assert [n for n, e in OBJECTIVES.items() if e.closed_form] == ["dm"]
    assert [n for n, e in OBJECTIVES.items() if e.aligns_later_points] == ["fula"]
