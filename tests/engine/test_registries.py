"""One catalogue for the vocabulary (issue 27): every name a user can write is one entry of
stitchsim.catalogue, and the engine's registries attach behaviour to the same names, in the
same order. A report that uses every entry renders on the page and in the table, so a new
entry cannot fail on a user's page."""

from __future__ import annotations

import html

import pytest
from stitchsim import catalogue
from stitchsim.table import format_table
from stitchsim_service.gateway.pages import render_report_page
from stitchsim_worker.engine.iri.methods import IRI_METHODS
from stitchsim_worker.engine.measures.metrics import FIGURES
from stitchsim_worker.engine.measures.outputs import OUTPUTS
from stitchsim_worker.engine.measures.similarity import MEASURES
from stitchsim_worker.engine.models.sources import SOURCES
from stitchsim_worker.engine.protocols import PROTOCOLS
from stitchsim_worker.engine.protocols.attacks import ATTACKS
from stitchsim_worker.engine.protocols.controls import CONTROLS
from stitchsim_worker.engine.protocols.cues import CUES
from stitchsim_worker.engine.registry import Registry
from stitchsim_worker.engine.stitching.objectives import (
    OBJECTIVES,
    ObjectiveEntry,
    register_objective,
)

from tests.report.every_entry import report_with_every_entry

ENGINE: dict[str, Registry] = {  # type: ignore[type-arg]
    catalogue.OBJECTIVES.kind: OBJECTIVES,
    catalogue.PROTOCOLS.kind: PROTOCOLS,
    catalogue.CONTROLS.kind: CONTROLS,
    catalogue.CUES.kind: CUES,
    catalogue.ATTACKS.kind: ATTACKS,
    catalogue.MEASURES.kind: MEASURES,
    catalogue.ROW_FIGURES.kind: FIGURES,
    catalogue.OUTPUT_KINDS.kind: OUTPUTS,
    catalogue.IRI_METHODS.kind: IRI_METHODS,
    catalogue.MODEL_SOURCES.kind: SOURCES,
}
WITHOUT_ENGINE_REGISTRY = {
    catalogue.MEASURE_INPUTS.kind: "real inputs and IRIs are the two inputs measures.in_job "
                                   "feeds every measure; nothing to register",
    catalogue.DATASET_FORMATS.kind: "safetensors is the one format data.datasets reads "
                                    "(issue 29 brings the readers' registry)",
    catalogue.CAVEATS.kind: "caveats are read off a report's own figures by "
                            "stitchsim.caveats (the engine records what it finds)",
    catalogue.BUDGETS.kind: "a budget is a preset of spec fields, expanded by the spec's own "
                            "validator (and `layers: auto` thinned by engine.job.prepare)",
    catalogue.RESOLUTIONS.kind: "a resolution is a preset of step sizes, filled in by Spec.at "
                                "at the size engine.job.prepare reads",
}


@pytest.mark.parametrize("kind", catalogue.KINDS, ids=lambda k: k.kind)
def test_every_catalogue_kind_and_its_engine_registry_hold_the_same_names_in_order(
    kind: catalogue.Kind,  # type: ignore[type-arg]
) -> None:
    # A new kind must say where its behaviour lives.
    assert (kind.kind in ENGINE) != (kind.kind in WITHOUT_ENGINE_REGISTRY), kind.kind
    for entry in kind:
        assert entry.label and len(entry.description) > 15, entry.name
    if kind.kind in ENGINE:
        registry = ENGINE[kind.kind]
        assert list(registry) == list(kind.names)
        assert all(entry.name == name for name, entry in registry.items())


def test_a_report_with_every_entry_renders_on_the_page_and_in_the_table() -> None:
    report = report_with_every_entry()
    page, table = render_report_page(report), format_table(report)
    for kind in (catalogue.OBJECTIVES, catalogue.PROTOCOLS, catalogue.CONTROLS, catalogue.CUES,
                 catalogue.MEASURES, catalogue.MEASURE_INPUTS):
        for entry in kind:
            assert html.escape(entry.label, quote=False) in page, (kind.kind, entry.name)
            assert entry.name in table, (kind.kind, entry.name)
    # Each protocol is drawn in its catalogue style (its own series on the agreement plot).
    for protocol in catalogue.PROTOCOLS.names:
        assert f"series-agreement-front_to_back-slm-{protocol}" in page
        assert catalogue.PROTOCOLS[protocol].style.color.lower() in page.lower()


def test_an_entry_cannot_be_registered_twice() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        register_objective(ObjectiveEntry(name="slm", fit=lambda task: 0.0, cost=lambda n, s: 0))
    with pytest.raises(ValueError, match="catalogued twice"):
        catalogue.OBJECTIVES.register(catalogue.OBJECTIVES["slm"])


def test_the_flags_say_what_the_entries_need() -> None:
    assert catalogue.OBJECTIVES.where(closed_form=True) == ("dm",)
    assert catalogue.OBJECTIVES.where(aligns_later_points=True) == ("fula",)
    assert catalogue.OBJECTIVES.where(labels_only=True) == ("hlm",)
    assert catalogue.drop_protocols() == ("standard", "invariance_aware")
    assert catalogue.PROTOCOLS.where(in_controls=False) == ("cross_task",)
    assert catalogue.PROTOCOLS.where(attacks=True) == ("adversarial", "iri_adversarial")
    assert catalogue.PROTOCOLS.where(uses_iris=True) == ("invariance_aware", "iri_adversarial")
    assert catalogue.PROTOCOLS["cross_task"].read_against == ("clustered_noise",)
    assert catalogue.CONTROLS.where(paints_cues=True) == ("shortcut",)
