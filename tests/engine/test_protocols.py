"""The rest of the published protocols (issue 15), each checked for the shape its paper
reports, on built-in data: robust vs standard models under the invariance-aware protocol and
robust agreement with its attack's transfer rate (issue 26), the unseen-cue suite
(excessive agreement), and cross-task pairing beside the clustered-noise floor."""

from __future__ import annotations

from pathlib import Path

import pytest
from stitchsim_worker.engine.models.robust import make_robust_checkpoint
from stitchsim_worker.engine.models.zoo import make_checkpoint

from tests.engine.jobs import FAST_IA, FAST_IRI, layers, rows, run, shared_cache, spec
from tests.fixtures_models import ROBUST_CODE, TRAINING_CODE, cached_model

QUICK = {"epochs": 4, "max_train_samples": 400, "max_test_samples": 300}


@pytest.fixture(scope="module")
def robust_seeds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two adversarially trained seeds (as `demo-models --robust` makes them), trained once and
    cached across runs (tests/fixtures_models.py), as the fixture models are."""
    root = tmp_path_factory.mktemp("robust")
    paths = []
    for seed in (2, 3):
        path = root / f"robust_{seed}.safetensors"

        def build(to: Path, seed: int = seed) -> dict[str, float]:
            clean, robust = make_robust_checkpoint(to, "test_resnet", "digits_digit_only",
                                                   seed=seed)
            return {"clean": clean, "robust": robust}

        settings = {"arch": "test_resnet", "dataset": "digits_digit_only", "seed": seed}
        info = cached_model("robust_resnet", settings, ROBUST_CODE, build, path)
        assert info["clean"] >= 0.95 and info["robust"] >= 0.85, info  # PGD-10 at 8/255
        paths.append(path)
    return paths[0], paths[1]


@pytest.fixture(scope="module")
def shapes_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("shapes") / "shapes.safetensors"

    def build(to: Path) -> dict[str, float]:
        return {"test_accuracy": make_checkpoint(to, "test_resnet", "shapes", epochs=4, lr=0.01)}

    settings = {"arch": "test_resnet", "dataset": "shapes", "epochs": 4, "lr": 0.01}
    assert cached_model("shapes_resnet", settings, TRAINING_CODE, build, path)[
        "test_accuracy"] >= 0.9
    return path


def test_robust_models_share_invariances_standard_ones_do_not_as_the_paper_finds(
    ckpts, robust_seeds: tuple[Path, Path]
) -> None:
    """The invariance-aware paper's robust-vs-standard finding (its Fig. on ResNet-18 /
    CIFAR-10): under the invariance-aware protocol, on clean test data, two robust seeds agree
    far more than a robust front into a standard back and a standard front into a robust back,
    while the standard protocol keeps every pairing high.

    IRIs by the paper's method (the default). Measured on these models (layer3, layer4), whose
    training differs with the CPU's kernels: on an Intel Xeon with AVX-512, robust <-> robust
    0.97, 0.94; robust -> standard 0.64, 0.51; standard -> robust 0.10, 0.10; the same machine
    held to AVX2 (ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2): 0.98, 0.91; 0.30, 0.32;
    0.10, 0.10 (narrow test_resnets share no invariances, see run_command.DEMO_ARCH_KWARGS);
    standard protocol 0.95-0.99 for every pairing. Fast IRIs separate the pairings less and
    less stably: robust -> standard 0.71, 0.49 under AVX2 (0.76, 0.54 on an AMD EPYC) but 0.84,
    0.67 under AVX-512, which failed the 0.15 gap at layer3. Under-converged IRIs (the paper's
    method cut to 50 or 100 steps) fail robust <-> robust instead (0.24, 0.49 and 0.94, 0.67).
    IRIs equal to x fail the gaps (0.98 against 0.96, 0.97)."""
    robust, robust_b = robust_seeds
    points = layers("layer3", "layer4")

    def job(front: Path, back: Path, directions: str) -> list:
        s = spec(front, back, objectives=["slm"], protocols=["standard", "invariance_aware"],
                 layers=points, train=FAST_IA, directions=directions)
        return run(s, shared_cache()).results

    def by(results: list, protocol: str, direction: str = "front_to_back") -> list[float]:
        return [r.agreement for r in results if r.protocol == protocol
                and r.direction == direction]

    both = job(robust, robust_b, "front_to_back")
    mixed = job(robust, ckpts.digits_resnet, "both")  # robust -> standard, standard -> robust
    rr, rs = by(both, "invariance_aware"), by(mixed, "invariance_aware")
    sr = by(mixed, "invariance_aware", "back_to_front")
    assert len(rr) == len(rs) == len(sr) == 2
    for r_r, r_s, s_r in zip(rr, rs, sr, strict=True):
        assert r_r >= 0.85, (rr, rs, sr)
        assert r_r - r_s >= 0.15, (rr, rs, sr)
        assert r_r - s_r >= 0.5, (rr, rs, sr)
    standard = by(both, "standard") + by(mixed, "standard") + by(mixed, "standard",
                                                                  "back_to_front")
    assert min(standard) >= 0.85, standard


def test_robust_rows_name_the_attack_and_its_transfer_and_each_alpha_is_a_row(
    ckpts, tmp_path: Path
) -> None:
    # The paper's AutoAttack crafted against a stitched model of two standard seeds fools it
    # on nearly every input but hardly transfers to the back model: robust agreement then
    # measures the attack, not the similarity, which the transfer rate shows. alpha 0 runs as
    # the clean arm. (Measured, bench/robust_eval_attacks.py: success 0.96 at alpha 0, 0.89
    # at alpha 1, transfer 0.03 and 0.02; Croce's reference apgd 0.97, 0.92, 0.03, 0.03.)
    s = spec(ckpts.digits_resnet, ckpts.digits_resnet_b, objectives=["slm"],
             protocols=["adversarial"], layers=layers("layer3"), train=QUICK,
             adversarial={"evaluate": True, "alphas": [0, 1]})
    results = run(s, tmp_path).results
    assert [r.alpha for r in results] == [0, 1]
    for r in results:
        assert r.robust is not None and r.robust.attack == "autoattack_paper"
        assert r.robust.steps == 20 and r.robust.step_size == 2 / 255
        assert r.agreement >= 0.9, (r.alpha, r.agreement)  # clean agreement stays high
        assert r.robust.success_rate >= 0.8 and r.robust.transfer_rate <= 0.1, r.robust
        assert r.robust.back_accuracy >= 0.9


def test_unseen_cues_give_excessive_agreement_under_the_standard_protocol_only(
    ckpts
) -> None:
    # The marker model reads class-coloured squares; painted cues steer its features, so a
    # standard stitch agrees with the back model through the cue (right cues vs rolled ones).
    # Its IRIs carry no digit, so the invariance-aware stitch has nothing of the cue to follow.
    # (Between two clean seeds, slm shows no excessive agreement at all: the back model
    # ignores the cue, so its targets give the stitch no reason to follow it.)
    s = spec(ckpts.marker_resnet, ckpts.digits_resnet, objectives=["slm"],
             protocols=["standard", "invariance_aware"], layers=layers("layer4"), train=FAST_IA,
             iri=FAST_IRI, controls=["shortcut"])
    report = run(s, shared_cache())  # its IRIs are test_invariance.py's shortcut control's
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
