"""The invariance-aware paper's figures under their own names (issue 26): correct agreement
(both right or both wrong: the paper's hard_agreement) beside hard agreement (same class),
soft kappa beside Cohen's kappa, each against a hand-computed case a wrong formula fails; the
unstitched endpoint against a direct computation in a real job; FuLA at every block output."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from stitchsim import catalogue
from stitchsim.models import Spec
from stitchsim_worker.engine import Resources
from stitchsim_worker.engine.core.context import Cut
from stitchsim_worker.engine.job.prepare import prepare
from stitchsim_worker.engine.measures.metrics import FIGURES, evaluate
from stitchsim_worker.engine.models.loading import random_model
from stitchsim_worker.engine.models.network import Network
from stitchsim_worker.engine.protocols.fitting import alignment_points

from tests.engine.jobs import TINY, run, spec


def _logits(probs: list[list[float]]) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64).log()


def test_correct_agreement_counts_both_wrong_with_different_classes_hard_agreement_does_not(
) -> None:
    # Label 0 throughout. Sample 1: both right. Samples 2 and 3: both wrong, with different
    # classes. Sample 4: h right, g wrong.
    h = torch.eye(4)[[0, 1, 2, 0]] * 5
    g = torch.eye(4)[[0, 2, 1, 3]] * 5
    figures = evaluate(h, g, torch.zeros(4, dtype=torch.long)).figures
    assert figures.hard_agreement == pytest.approx(1 / 4)  # same class: sample 1 only
    assert figures.correct_agreement == pytest.approx(3 / 4)  # samples 1, 2 and 3
    # Cohen's kappa of rightness: observed 3/4, expected 2/4 * 1/4 + 2/4 * 3/4 = 1/2.
    assert figures.error_consistency == pytest.approx((0.75 - 0.5) / (1 - 0.5))


def test_soft_kappa_against_the_papers_formula_by_hand() -> None:
    # K = 3; h and g agree exactly on sample 1; on sample 2 h is uniform.
    h = _logits([[0.5, 0.25, 0.25], [1 / 3, 1 / 3, 1 / 3]])
    g = _logits([[0.5, 0.25, 0.25], [0.5, 0.25, 0.25]])
    labels = torch.tensor([0, 1])
    # Soft agreement: 1 on sample 1; on sample 2 <p,q> = 1/3 over max(|p|^2 = 1/3,
    # |q|^2 = 3/8) = 8/9.
    c_obs = (1 + Fraction(8, 9)) / 2
    a = (Fraction(1, 2) + Fraction(1, 3)) / 2  # h's mean probability of the true class
    b = (Fraction(1, 2) + Fraction(1, 4)) / 2
    c_exp = a * b + (1 - a) * (1 - b) / (3 - 1)
    kappa = float((c_obs - c_exp) / (1 - c_exp))
    figures = evaluate(h, g, labels).figures
    assert figures.agreement == pytest.approx(float(c_obs))
    assert figures.soft_kappa == pytest.approx(kappa, abs=1e-6)  # float32 softmax
    # What a wrong formula gives instead: no 1/(K-1) on the error term, or the unnormalised
    # dot product as c_obs. The hand value is told apart from both (by far more than 1e-6).
    no_spread = a * b + (1 - a) * (1 - b)
    assert abs(kappa - float((c_obs - no_spread) / (1 - no_spread))) > 0.01
    raw = (Fraction(3, 8) + Fraction(1, 3)) / 2
    assert abs(kappa - float((raw - c_exp) / (1 - c_exp))) > 0.01


def test_identical_models_have_every_figure_at_one() -> None:
    torch.manual_seed(0)
    g = torch.randn(50, 10)
    figures = evaluate(g, g.clone(), torch.randint(0, 10, (50,))).figures
    for name in ("agreement", "hard_agreement", "correct_agreement", "error_consistency",
                 "soft_kappa"):
        assert figures[name] == pytest.approx(1.0), name


def test_every_class_figure_is_catalogued_and_registered() -> None:
    assert list(FIGURES) == list(catalogue.ROW_FIGURES.where(classes=True))


def test_a_real_jobs_unstitched_agreement_is_the_two_whole_models_against_each_other(
    untrained: Any, tmp_path: Path,
) -> None:
    # Two random inits (no training: a second): the endpoint is a property of any two models.
    s = spec(untrained.front, untrained.back, layers=[{"front": "layer2", "back": "layer2"}],
             objectives=["dm"], protocols=["standard"], train=TINY)
    s = s.model_copy(update={"directions": "both"})
    report = run(s, tmp_path)
    assert [u.direction for u in report.unstitched_agreement] == ["front_to_back",
                                                                  "back_to_front"]
    # Directly: both models on the job's test split, and the definitions written out here.
    prep = prepare(s, Resources(cache_dir=tmp_path / "direct"), torch.device("cpu"))
    pixels, labels = prep.data.test.pixels.all(), prep.data.test.labels.numpy()
    with torch.no_grad():
        f = prep.front.logits(pixels).double().softmax(-1).numpy()
        g = prep.back.logits(pixels).double().softmax(-1).numpy()
    dot = (f * g).sum(1) / np.maximum((f * f).sum(1), (g * g).sum(1))
    f_right, g_right = f.argmax(1) == labels, g.argmax(1) == labels
    for end in report.unstitched_agreement:
        assert end.samples == len(labels) == 100
        assert end.agreement == pytest.approx(dot.mean(), abs=1e-5)
        assert end.hard_agreement == pytest.approx((f.argmax(1) == g.argmax(1)).mean())
        assert end.value("correct_agreement") == pytest.approx((f_right == g_right).mean())
        assert end.agreement_ci[0] <= end.agreement <= end.agreement_ci[1]
    ends = {u.direction: u for u in report.unstitched_agreement}
    assert ends["front_to_back"].accuracy == pytest.approx(f_right.mean())
    assert ends["back_to_front"].accuracy == pytest.approx(g_right.mean())
    # Two seeds: their softmaxes differ (the figure is not a constant 1).
    assert ends["front_to_back"].agreement < 0.999
    # Every row carries the paper's names too.
    for r in report.results:
        assert {"correct_agreement", "soft_kappa"} <= set(r.figures)


TINY_RESNET18 = {"channels": (8, 16, 32, 64), "stem_width": 8, "num_classes": 10}


def _cut(net: Network, point: str) -> Cut:
    return Cut("front_to_back", (point, point), net, point, net, point)


def test_fula_aligns_at_every_block_output_by_default_as_the_paper_does() -> None:
    net = Network(random_model("resnet18", TINY_RESNET18, 32), 32, torch.device("cpu"), "back")
    # The stem and 2 basic blocks in each of 4 stages: the paper's 9 points on ResNet-18.
    assert net.block_points() == ["act1", "layer1.0", "layer1.1", "layer2.0", "layer2.1",
                                  "layer3.0", "layer3.1", "layer4.0", "layer4.1"]
    blocks = Spec.model_validate({"front": {"checkpoint": "x"}, "back": {"checkpoint": "x"},
                                  "objectives": ["fula"]})
    assert blocks.fula.points == "blocks"
    stages = blocks.model_copy(update={"fula": blocks.fula.model_copy(
        update={"points": "stages"})})
    # Stitched at the stem: the stitch point and every later block, 9 terms in all.
    at_stem = alignment_points(SimpleNamespace(spec=blocks), _cut(net, "act1"))  # type: ignore[arg-type]
    assert at_stem == net.block_points()
    assert alignment_points(SimpleNamespace(spec=stages), _cut(net, "act1")) == [  # type: ignore[arg-type]
        "act1", "layer1", "layer2", "layer3", "layer4"]
    # Inside a stage: its later block, then every block after it; the last block is the end.
    assert alignment_points(SimpleNamespace(spec=blocks), _cut(net, "layer3.0")) == [  # type: ignore[arg-type]
        "layer3.0", "layer3.1", "layer4.0", "layer4.1"]
    # The back part gives the block tensors, the stage spelling the same tensors.
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        z = net.front("layer2.0")(x)
        _, by_block = net.back("layer2.0", net.later_points("layer2.0", "blocks"))(z, x)
        _, by_stage = net.back("layer2.0", net.later_points("layer2.0", "stages"))(z, x)
    assert len(by_block) == 5 and len(by_stage) == 3
    for stage_tensor, k in zip(by_stage, (0, 2, 4), strict=True):  # layer2, layer3, layer4
        torch.testing.assert_close(stage_tensor, by_block[k])
    assert not math.isnan(float(by_block[-1].sum()))


def test_an_unknown_fula_points_value_names_the_field_and_the_allowed_values() -> None:
    with pytest.raises(ValidationError) as err:
        Spec.model_validate({"front": {"checkpoint": "x"}, "back": {"checkpoint": "x"},
                             "fula": {"points": "layers"}})
    text = str(err.value)
    assert "fula.points" in text and "'blocks'" in text and "'stages'" in text
