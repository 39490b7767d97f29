"""One catalogue for the vocabulary (issue 27): every name a user can write is one entry of
stitchsim.catalogue, and the engine's registries attach behaviour to the same names, in the
same order. A report that uses every entry renders on the page and in the table, so a new
entry cannot fail on a user's page."""

from __future__ import annotations

import dataclasses
import html

import pytest
from stitchsim import catalogue
from stitchsim.table import format_table
from stitchsim_service.gateway.pages import render_report_page
from stitchsim_worker.engine.core.registry import Registry
from stitchsim_worker.engine.measures.metrics import FIGURES
from stitchsim_worker.engine.measures.outputs import OUTPUTS
from stitchsim_worker.engine.measures.similarity import MEASURE_IMPLS
from stitchsim_worker.engine.models.attacks import ATTACK_IMPLS
from stitchsim_worker.engine.models.sources import SOURCES
from stitchsim_worker.engine.protocols import PROTOCOL_IMPLS, register_protocol
from stitchsim_worker.engine.protocols.controls import CONTROL_IMPLS
from stitchsim_worker.engine.protocols.cues import CUE_IMPLS
from stitchsim_worker.engine.stitching.objectives import (
    OBJECTIVE_IMPLS,
    register_objective,
)

from tests.report.every_entry import report_with_every_entry

ENGINE: dict[str, Registry] = {  # type: ignore[type-arg]
    catalogue.OBJECTIVES.kind: OBJECTIVE_IMPLS,
    catalogue.PROTOCOLS.kind: PROTOCOL_IMPLS,
    catalogue.CONTROLS.kind: CONTROL_IMPLS,
    catalogue.CUES.kind: CUE_IMPLS,
    catalogue.ATTACKS.kind: ATTACK_IMPLS,
    catalogue.MEASURES.kind: MEASURE_IMPLS,
    catalogue.ROW_FIGURES.kind: FIGURES,
    catalogue.OUTPUT_KINDS.kind: OUTPUTS,
    catalogue.MODEL_SOURCES.kind: SOURCES,
}
WITHOUT_ENGINE_REGISTRY = {
    catalogue.MEASURE_INPUTS.kind: "real inputs and IRIs are the two inputs job.measuring "
                                   "feeds every measure; nothing to register",
    catalogue.DATASET_FORMATS.kind: "safetensors is the one format data.datasets reads "
                                    "(issue 29 brings the readers' registry)",
    catalogue.CAVEATS.kind: "caveats are read off a report's own figures by "
                            "stitchsim.caveats (the engine records what it finds)",
    catalogue.IRI_METHODS.kind: "a method is a preset of the IRI settings, filled in by the "
                                "spec's validator; one generator (iri.synthesis) runs them all",
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
        # The figure registry scores class outputs; a kind without classes scores its own.
        names = kind.where(classes=True) if kind is catalogue.ROW_FIGURES else kind.names
        assert list(registry) == list(names)
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
        register_objective(dataclasses.replace(OBJECTIVE_IMPLS["slm"]))
    with pytest.raises(ValueError, match="catalogued twice"):
        catalogue.OBJECTIVES.register(catalogue.OBJECTIVES["slm"])


def test_the_flags_say_what_the_entries_need() -> None:
    assert catalogue.OBJECTIVES.where(closed_form=True) == ("dm",)
    assert catalogue.OBJECTIVES.where(aligns_later_points=True) == ("fula",)
    assert catalogue.OBJECTIVES.where(labels_only=True) == ("hlm",)
    assert catalogue.drop_protocols() == (catalogue.BASELINE_PROTOCOL, catalogue.IRI_PROTOCOL)
    assert (catalogue.BASELINE_PROTOCOL, catalogue.IRI_PROTOCOL) == ("standard", "invariance_aware")
    assert catalogue.PROTOCOLS.where(in_controls=False) == ("cross_task",)
    assert catalogue.PROTOCOLS.where(attacks=True) == ("adversarial", "iri_adversarial")
    assert catalogue.PROTOCOLS.where(uses_iris=True) == ("invariance_aware", "iri_adversarial")
    assert catalogue.PROTOCOLS["cross_task"].read_against == ("clustered_noise",)
    assert catalogue.CONTROLS.where(paints_cues=True) == ("shortcut",)


def test_the_catalogue_flags_agree_with_what_the_implementations_do() -> None:
    for name, impl in PROTOCOL_IMPLS.items():
        flags = catalogue.PROTOCOLS[name]
        assert flags.attacks == (impl.augment is not None), name
        assert flags.in_controls == (impl.test_split is None), name
    for name, objective in OBJECTIVE_IMPLS.items():
        assert catalogue.OBJECTIVES[name].aligns_later_points == objective.with_feats, name


def test_an_implementation_that_contradicts_its_flags_is_refused_at_registration() -> None:
    # Checked before the name is taken: the refusal is the flag's, not "registered twice".
    augment = "for its implementation 'has an augment' is"
    with pytest.raises(ValueError, match=f"attacks=True, but {augment} False"):
        register_protocol(dataclasses.replace(PROTOCOL_IMPLS["adversarial"], augment=None))
    with pytest.raises(ValueError, match="in_controls=False"):
        register_protocol(dataclasses.replace(PROTOCOL_IMPLS["cross_task"], test_split=None))
    with pytest.raises(ValueError, match=f"attacks=False, but {augment} True"):
        register_protocol(dataclasses.replace(PROTOCOL_IMPLS["standard"],
                                              augment=PROTOCOL_IMPLS["adversarial"].augment))
    with pytest.raises(ValueError, match="aligns_later_points=True"):
        register_objective(dataclasses.replace(OBJECTIVE_IMPLS["fula"], with_feats=False))
    with pytest.raises(ValueError, match="aligns_later_points=False"):
        register_objective(dataclasses.replace(OBJECTIVE_IMPLS["slm"], with_feats=True))
    assert list(PROTOCOL_IMPLS) == list(catalogue.PROTOCOLS.names)  # nothing half-registered


def test_the_roles_are_checked_against_their_protocols_flags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    catalogue._check_roles()  # the catalogue's own roles pass
    monkeypatch.setattr(catalogue, "IRI_PROTOCOL", "iri_adversarial")
    with pytest.raises(ValueError, match="attack nothing"):
        catalogue._check_roles()
    monkeypatch.setattr(catalogue, "IRI_PROTOCOL", "invariance_aware")
    monkeypatch.setattr(catalogue, "BASELINE_PROTOCOL", "invariance_aware")
    with pytest.raises(ValueError, match="must be plain"):
        catalogue._check_roles()


def test_a_registry_takes_the_catalogues_order_whatever_the_order_of_registration() -> None:
    @dataclasses.dataclass(frozen=True)
    class Named:
        name: str

    registry: Registry[Named] = Registry("example")
    for name in ("c", "z", "a"):  # as modules found in a folder might register them
        registry.register(Named(name))
    registry.order_by(["a", "b", "c"])
    assert list(registry) == ["a", "c", "z"]  # one the catalogue lacks keeps its place, after
