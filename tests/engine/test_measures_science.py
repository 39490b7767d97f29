"""The measures on trained models (issue 14): two seeds of one architecture look alike to
CKA on real inputs and much less so on the front model's IRIs at deep points; a model and
a channel-permuted copy of it (the same function, other tensors) score 1 on both; the floor
lies under the figures; intervals have width; both conditionals show with two directions and
two architectures; figures are deterministic for a seed."""

from __future__ import annotations

from pathlib import Path

from stitchsim.models import MeasureRow, Report
from stitchsim_worker.engine.core.refcache import PREFIX

from tests.engine.jobs import FAST, FAST_IRI, layers, run, spec
from tests.engine.permuted import permuted_copy

MEASURES = ["cka", "mutual_knn"]
# IRIs of the test split (the paper's variant): the measures' own synthesis, on few samples.
SMALL = {**FAST, "max_train_samples": 200, "max_test_samples": 200}
TEST_IRIS = {"iri_split": "test"}


def _one(rows: list[MeasureRow], **match: object) -> MeasureRow:
    found = [r for r in rows if all(getattr(r, k) == v for k, v in match.items())]
    assert len(found) == 1, (match, found)
    return found[0]


def _measured(ckpts, front: Path, back: Path, tmp_path: Path, **fields: object) -> Report:  # type: ignore[no-untyped-def]
    # dm is solved in closed form: the stitching costs next to nothing beside the IRIs.
    fields = {"train": SMALL, "measure_settings": TEST_IRIS, **fields}
    s = spec(front, back, objectives=["dm"], protocols=["standard"], iri=FAST_IRI,
             measures=MEASURES, **fields)
    return run(s, tmp_path)


def test_two_seeds_align_on_real_inputs_and_much_less_on_iris(ckpts, tmp_path: Path) -> None:
    report = _measured(ckpts, ckpts.digits_resnet, ckpts.digits_resnet_b, tmp_path,
                       layers=layers("layer3", "layer4"))
    for layer in ("layer3", "layer4"):
        real = _one(report.measures, measure="cka", input="real", front_layer=layer)
        iri = _one(report.measures, measure="cka", input="iri", front_layer=layer)
        assert real.value >= 0.8, layer
        assert real.value - iri.value >= 0.3, (layer, real.value, iri.value)
        assert real.ci[0] <= real.value <= real.ci[1] and iri.ci[0] <= iri.value <= iri.ci[1]
        # Figures of 200 samples that are not 1: a bootstrap of them has width.
        assert real.ci[1] - real.ci[0] >= 0.005 and iri.ci[1] - iri.ci[0] >= 0.005, (real, iri)
        assert (real.split, iri.split, real.samples, iri.samples) == ("test", "test", 200, 200)
        knn_real = _one(report.measures, measure="mutual_knn", input="real", front_layer=layer)
        knn_iri = _one(report.measures, measure="mutual_knn", input="iri", front_layer=layer)
        assert knn_real.value - knn_iri.value >= 0.3
        for name, value in (("cka", real.value), ("mutual_knn", knn_real.value)):
            # (The identity ceiling is the measure of a model with itself: 1 by definition,
            # so only its presence is checked.)
            _one(report.measure_controls, measure=name, control="identity", front_layer=layer)
            floors = [r for r in report.measure_controls if r.measure == name
                      and r.control == "clustered_noise" and r.input == "real"
                      and r.front_layer == layer]
            assert len(floors) == 2 and all(f.value < value - 0.05 for f in floors)
    (cka,) = [m for m in report.summary.measures if m.measure == "cka"]
    assert cka.gap is not None and cka.gap >= 0.3

    # Deterministic for a seed (the IRIs now come from the cache).
    again = _measured(ckpts, ckpts.digits_resnet, ckpts.digits_resnet_b, tmp_path,
                      layers=layers("layer3", "layer4"))
    assert [(m.value, m.ci) for m in again.measures] == [(m.value, m.ci) for m in report.measures]


def test_a_model_and_its_permuted_copy_score_one_on_real_inputs_and_on_iris(
    ckpts, tmp_path: Path
) -> None:
    # Not one model on both sides (1 by definition): the back model's tensors at layer4 are
    # the front's with their channels shuffled, which both measures must see through. A
    # measure that compared channels one by one, or paired the wrong samples, would not.
    copy = permuted_copy(ckpts.digits_resnet, tmp_path / "permuted.safetensors")
    tiny = {**FAST, "max_train_samples": 100, "max_test_samples": 100}
    report = _measured(ckpts, ckpts.digits_resnet, copy, tmp_path,
                       layers=layers("layer4"), train=tiny,
                       measure_settings={"batch_size": 100, **TEST_IRIS})
    assert report.back.accuracy == report.front.accuracy  # the same function
    assert len(report.measures) == 4
    for r in report.measures:
        assert r.value > 0.999, (r.measure, r.input, r.value)


def test_both_conditionals_across_architectures(ckpts, tmp_path: Path) -> None:
    s = spec(ckpts.digits_resnet, ckpts.digits_vit, objectives=["dm"],
             protocols=["invariance_aware"], train=SMALL, iri=FAST_IRI, measures=["cka"],
             layers=[{"front": "layer3", "back": "blocks.3"}])
    report = run(s.model_copy(update={"directions": "both"}), tmp_path)
    by = {(r.direction, r.input): r for r in report.measures}
    assert set(by) == {(d, k) for d in ("front_to_back", "back_to_front") for k in ("real", "iri")}
    # On IRIs each direction reads the IRIs of its own front model: two conditionals.
    assert by[("front_to_back", "iri")].value != by[("back_to_front", "iri")].value
    weaker = min(("front_to_back", "back_to_front"), key=lambda d: by[(d, "iri")].value)
    assert report.summary.measure_weaker_direction == {"cka": weaker}
    # Reused from the invariance-aware protocol: no IRI synthesis of the measures' own.
    assert len(list((tmp_path / PREFIX / "iri").rglob("*.json"))) == 2
