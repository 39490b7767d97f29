"""The rest of the published protocols (issue 15), each checked for the shape its paper
reports, on built-in data: adversarial stitching with robust agreement, the unseen-cue suite
(excessive agreement), and cross-task pairing beside the clustered-noise floor."""

from __future__ import annotations

from pathlib import Path

import pytest
from stitchsim_worker.engine.models.robust import make_robust_checkpoint
from stitchsim_worker.engine.models.zoo import make_checkpoint

from tests.engine.jobs import FAST_IA, FAST_IRI, layers, rows, run, spec
from tests.fixtures_models import ROBUST_CODE, TRAINING_CODE, cached_model

QUICK = {"epochs": 4, "max_train_samples": 400, "max_test_samples": 300}


@pytest.fixture(scope="module")
def robust_front(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Trained once and cached across runs (tests/fixtures_models.py), as the fixture models.
    path = tmp_path_factory.mktemp("robust") / "robust.safetensors"

    def build(to: Path) -> dict[str, float]:
        clean, robust = make_robust_checkpoint(to, "test_resnet", "digits_digit_only", seed=2)
        return {"clean": clean, "robust": robust}

    settings = {"arch": "test_resnet", "dataset": "digits_digit_only", "seed": 2}
    info = cached_model("robust_resnet", settings, ROBUST_CODE, build, path)
    assert info["clean"] >= 0.95 and info["robust"] >= 0.85, info  # PGD-10 at 8/255
    return path


@pytest.fixture(scope="module")
def shapes_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("shapes") / "shapes.safetensors"

    def build(to: Path) -> dict[str, float]:
        return {"test_accuracy": make_checkpoint(to, "test_resnet", "shapes", epochs=4, lr=0.01)}

    settings = {"arch": "test_resnet", "dataset": "shapes", "epochs": 4, "lr": 0.01}
    assert cached_model("shapes_resnet", settings, TRAINING_CODE, build, path)[
        "test_accuracy"] >= 0.9
    return path


def test_robust_agreement_separates_a_robust_front_from_a_non_robust_seed(
    ckpts, robust_front: Path, tmp_path: Path
) -> None:
    # Attacks crafted against the stitched model fool a stitched model built on a non-robust
    # front but hardly transfer to the back model, so the two part ways; a robust front keeps
    # the stitched model right, and so in agreement with the (unattacked) back model.
    def job(front: Path) -> list:
        s = spec(front, ckpts.digits_resnet_b, objectives=["slm"],
                 protocols=["standard", "adversarial"], layers=layers("layer3"), train=QUICK,
                 adversarial={"evaluate": True})
        return run(s, tmp_path).results

    seeds, robust = job(ckpts.digits_resnet), job(robust_front)
    for r in seeds + robust:
        assert r.robust is not None and r.robust.steps == 10
        assert r.agreement >= 0.9, (r.protocol, r.agreement)  # clean agreement stays high
        assert r.robust.back_accuracy >= 0.9  # the attack barely transfers to the back model
    for seed_row, robust_row in zip(seeds, robust, strict=True):
        assert seed_row.robust.agreement <= 0.3 and seed_row.robust.accuracy <= 0.2
        assert robust_row.robust.agreement - seed_row.robust.agreement >= 0.5


def test_unseen_cues_give_excessive_agreement_under_the_standard_protocol_only(
    ckpts, tmp_path: Path
) -> None:
    # The marker model reads class-coloured squares; painted cues steer its features, so a
    # standard stitch agrees with the back model through the cue (right cues vs rolled ones).
    # Its IRIs carry no digit, so the invariance-aware stitch has nothing of the cue to follow.
    # (Between two clean seeds, slm shows no excessive agreement at all: the back model
    # ignores the cue, so its targets give the stitch no reason to follow it.)
    s = spec(ckpts.marker_resnet, ckpts.digits_resnet, objectives=["slm"],
             protocols=["standard", "invariance_aware"], layers=layers("layer4"), train=FAST_IA,
             iri=FAST_IRI, controls=["shortcut"])
    report = run(s, tmp_path)
    excess = {(e.cue, e.protocol): e.max_excessive_agreement
              for e in report.summary.excessive_agreement}
    assert len(rows(report, control="shortcut")) == 6  # three cues, two protocols
    assert excess[("pixel_specific", "standard")] >= 0.25
    drop = excess[("pixel_specific", "standard")] - excess[("pixel_specific", "invariance_aware")]
    assert drop >= 0.2
    for protocol in ("standard", "invariance_aware"):
        assert abs(excess[("rand_rand", protocol)]) <= 0.05


def test_cross_task_pairing_reaches_far_above_chance_beside_the_noise_floor(
    ckpts, shapes_model: Path, tmp_path: Path
) -> None:
    s = spec(shapes_model, ckpts.digits_resnet, objectives=["hlm"], protocols=["cross_task"],
             layers=layers("layer4"), train=QUICK, front_dataset="shapes",
             dataset="digits_digit_only", controls=[])
    report = run(s, tmp_path)
    (row,) = report.results
    assert row.accuracy >= 0.8  # shapes drive the digits head; chance is 0.1
    floor = rows(report, control="clustered_noise")  # added by the protocol itself
    assert floor and max(f.accuracy for f in floor) >= 0.5  # and so do class-clustered noise
    # Against its floor: on accuracy the pairing cannot beat it here, both are saturated
    # (measured: 1.000 for the row and for the floor at sigma 0.1 and 0.3, intervals (1, 1)):
    # at layer4 class-clustered noise is as separable as the shapes model's features, which
    # is the paper's warning, and the notes say so. It must not fall below the floor, and on
    # agreement with the back model's soft outputs it stays above it (measured: 0.995 against
    # 0.983 at sigma 0.1 and 0.980 at sigma 0.3).
    assert all(row.accuracy >= f.accuracy for f in floor), (row.accuracy, floor)
    top = max(f.agreement for f in floor)
    assert row.agreement - top >= 0.005, (row.agreement, [(f.sigma, f.agreement) for f in floor])
    assert report.front.accuracy >= 0.9  # the front model scored on its own task
    assert any("not that they mean the same" in n for n in report.notes)
