"""The summary definitions (rAuA per protocol, similarity in the weaker direction, drops,
verdict, caveats) on hand-made rows, so every figure can be checked exactly."""

from __future__ import annotations

import pytest
from stitchsim import catalogue
from stitchsim.models import IRIStats, ModelSummary, ResultRow, Spec
from stitchsim_worker.engine.measures.summary import (
    similarity_protocol,
    summarise,
    verdict,
    verdict_caveats,
    withheld,
)

SPEC = Spec.model_validate({
    "front": {"checkpoint": "sha256:" + "a" * 64}, "back": {"checkpoint": "sha256:" + "b" * 64},
    "objectives": ["slm"], "threshold": 0.5,
})


def _iri(converged: bool) -> IRIStats:
    return IRIStats(method="paper", start_median=0.9, median=0.1 if converged else 0.4, p90=0.5,
                    max=0.6,
                    converged=converged, cache_hit=False, n=10, seconds=1.0)


def _row(direction: str, layer: str, protocol: str, agreement: float,
         converged: bool = True) -> ResultRow:
    ci = (agreement - 0.01, agreement + 0.01)
    return ResultRow(
        direction=direction, front_layer=layer, back_layer=layer, objective="slm",  # type: ignore[arg-type]
        protocol=protocol, agreement=agreement, agreement_ci=ci, hard_agreement=agreement,  # type: ignore[arg-type]
        hard_agreement_ci=ci, accuracy=0.9, accuracy_ci=ci, stitching_penalty=0.0,
        error_consistency=0.5, error_consistency_ci=ci, train_loss=0.1, seconds=1.0,
        iri=_iri(converged) if protocol == "invariance_aware" else None,
    )


ROWS = [
    _row("front_to_back", "layer1", "standard", 0.95),
    _row("front_to_back", "layer1", "invariance_aware", 0.90),
    _row("front_to_back", "layer3", "standard", 0.93),
    _row("front_to_back", "layer3", "invariance_aware", 0.50),
    _row("back_to_front", "layer1", "standard", 0.96),
    _row("back_to_front", "layer1", "invariance_aware", 0.80),
    _row("back_to_front", "layer3", "standard", 0.94),
    _row("back_to_front", "layer3", "invariance_aware", 0.40, converged=False),
]


def test_similarity_is_the_invariance_aware_mean_in_the_weaker_direction() -> None:
    s = summarise(SPEC, ROWS)
    assert s.by_direction["invariance_aware"] == pytest.approx(
        {"front_to_back": 0.70, "back_to_front": 0.60})
    assert s.by_protocol == pytest.approx({"standard": 0.94, "invariance_aware": 0.60})
    assert s.similarity == pytest.approx(0.60) and s.similarity_protocol == "invariance_aware"
    assert s.weaker_direction == "back_to_front"
    assert verdict(s) == "similar"  # 0.60 >= 0.5


def test_drops_per_point_and_their_means() -> None:
    drops = summarise(SPEC, ROWS).drops
    means = {(d.direction, d.objective): d for d in drops if d.front_layer is None}
    assert means[("front_to_back", "slm")].drop == pytest.approx(0.94 - 0.70)
    per_point = {(d.direction, d.front_layer): d.drop for d in drops if d.front_layer}
    assert per_point[("front_to_back", "layer1")] == pytest.approx(0.05)
    assert per_point[("back_to_front", "layer3")] == pytest.approx(0.54)
    standard_only = [r for r in ROWS if r.protocol == "standard"]
    assert summarise(SPEC.model_copy(update={"protocols": ["standard"]}), standard_only).drops \
        == []


@pytest.mark.parametrize("protocol", catalogue.PROTOCOLS.names)
def test_any_protocol_run_alone_gives_the_similarity(protocol: str) -> None:
    rows = [r.model_copy(update={"protocol": protocol}) for r in ROWS if r.protocol == "standard"]
    s = summarise(SPEC.model_copy(update={"protocols": [protocol]}), rows)
    assert s.similarity_protocol == protocol and s.similarity == pytest.approx(0.94)
    assert s.weaker_direction == "front_to_back"


def test_a_protocol_new_to_the_catalogue_needs_nothing_of_the_summary(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(catalogue.PROTOCOLS, "entries", catalogue.PROTOCOLS.entries)
    catalogue.PROTOCOLS.register(catalogue.ProtocolEntry("telepathy", "telepathy", "a new one"))
    rows = [r.model_copy(update={"protocol": "telepathy"}) for r in ROWS
            if r.protocol == "standard"]
    s = summarise(SPEC.model_copy(update={"protocols": ["telepathy"]}), rows)
    assert s.similarity_protocol == "telepathy" and s.similarity == pytest.approx(0.94)
    assert similarity_protocol(["telepathy", "standard"]) == "standard"  # rank 0 < 1


def test_the_similarity_protocol_is_the_highest_ranked_that_ran() -> None:
    assert similarity_protocol(catalogue.PROTOCOLS.names) == "invariance_aware"
    assert similarity_protocol(["cross_task", "standard"]) == "standard"
    # Equal ranks: the first in catalogue order.
    assert similarity_protocol(["cross_task", "adversarial"]) == "adversarial"


def test_unconverged_iris_are_a_caveat_of_the_verdict() -> None:
    method, loose = verdict_caveats(summarise(SPEC, ROWS), ROWS, SPEC.iri)
    assert "back_to_front layer3->layer3 (median 0.40)" in loose
    assert f"iri.method {SPEC.iri.described()}" in method and "iri.method" in loose
    converged = [r for r in ROWS if r.iri is None or r.iri.converged]
    # Converged IRIs leave the one caveat every IRI figure carries: the method it rests on.
    assert verdict_caveats(summarise(SPEC, converged), converged) == [method]
    standard = [r for r in ROWS if r.protocol == "standard"]
    spec = SPEC.model_copy(update={"protocols": ["standard"]})
    assert verdict_caveats(summarise(spec, standard), standard) == []


def test_a_model_at_chance_withholds_the_verdict() -> None:
    def model(near: bool) -> ModelSummary:
        return ModelSummary(checkpoint="x", arch="resnet18", accuracy=0.1 if near else 0.9,
                            accuracy_ci=(0.08, 0.12), input_size=32, near_chance=near)

    assert withheld(SPEC, model(False), model(False)) is None
    reason = withheld(SPEC, model(False), model(True))
    assert reason is not None and "the back model (resnet18)" in reason
    assert withheld(SPEC.model_copy(update={"threshold": None}), model(True), model(True)) is None


def test_an_adversarial_protocol_at_several_alphas_is_summarised_at_its_most_attacked_arm(
) -> None:
    spec = SPEC.model_copy(update={
        "protocols": ["standard", "adversarial"], "directions": "front_to_back",
        "adversarial": SPEC.adversarial.model_copy(update={"alphas": [0.0, 1.0]})})
    arms = [_row("front_to_back", "layer1", "adversarial", a).model_copy(update={"alpha": alpha})
            for a, alpha in ((0.9, 0.0), (0.6, 1.0))]
    s = summarise(spec, [_row("front_to_back", "layer1", "standard", 0.95), *arms])
    assert s.by_protocol["adversarial"] == pytest.approx(0.6)  # not the arms' mean, 0.75
