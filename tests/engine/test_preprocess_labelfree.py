"""Preprocessing where accuracy cannot decide (issue 28): a model near chance on the dataset
by design, or a dataset without labels, is judged by how well each candidate's batch
statistics match the running statistics of the model's first normalisation layer; where that
cannot decide either (no such layer, or one never trained), the choice is "undetermined", said
loudly in the report, never picked by noise."""

from __future__ import annotations

from pathlib import Path

import pytest
import timm
import torch
from stitchsim.models import ModelRef
from stitchsim_worker.engine.data.datasets import builtin
from stitchsim_worker.engine.models.loading import build_model, save_checkpoint
from stitchsim_worker.engine.models.preprocess import measure

from tests.engine.jobs import layers, run, spec
from tests.engine.test_preprocess import _train_plain

CPU = torch.device("cpu")
TINY = {"epochs": 1, "max_train_samples": 64, "max_test_samples": 64}


@pytest.fixture(scope="module")
def plain_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """test_resnet trained on raw [0,1] pixels: 'none' is its true preprocessing."""
    path = tmp_path_factory.mktemp("plain") / "plain.safetensors"
    _train_plain(path)
    return path


def _model(path: Path):  # type: ignore[no-untyped-def]
    return build_model(ModelRef(checkpoint={"path": str(path)}), path, "", where="front",
                       native_size=32)


def test_without_labels_the_normalisation_statistics_find_the_training_preprocessing(
    plain_model: Path,
) -> None:
    model = _model(plain_model)
    images = builtin("digits").train.images[:256]
    choice = measure(model.choice, model.net, images, None, CPU)
    assert choice.info.source == "measured" and choice.info.name == "none"
    distance = {c.name: c.stats_distance for c in choice.info.candidates}
    assert all(c.accuracy is None for c in choice.info.candidates)
    # The wrong candidates are far off, not marginally: ImageNet's mean/std scales the first
    # convolution's output about four-fold.
    others = [d for name, d in distance.items() if name != "none"]
    assert others and all(d > 10 * distance["none"] for d in others), distance
    assert "running statistics" in choice.info.note


def test_a_model_at_chance_by_design_is_not_judged_by_noise(plain_model: Path) -> None:
    # Labels the model cannot predict (the marker model of the issue on clean images): every
    # candidate scores chance, so accuracy decides nothing and the statistics decide.
    model = _model(plain_model)
    ds = builtin("digits")
    wrong = torch.randint(0, 10, (len(ds.train.labels),), generator=torch.Generator()
                          .manual_seed(0))
    choice = measure(model.choice, model.net, ds.train.images, wrong, CPU)
    accuracies = [c.accuracy for c in choice.info.candidates]
    assert all(a is not None and a < 0.2 for a in accuracies), accuracies
    assert choice.info.name == "none" and choice.info.source == "measured"
    assert choice.info.candidates[0].stats_distance is not None


def test_with_labels_that_separate_the_candidates_accuracy_still_decides(
    plain_model: Path,
) -> None:
    model = _model(plain_model)
    ds = builtin("digits")
    choice = measure(model.choice, model.net, ds.train.images, ds.train.labels, CPU)
    assert choice.info.name == "none"
    assert all(c.stats_distance is None for c in choice.info.candidates)  # not needed


def test_when_nothing_decides_the_report_says_undetermined_loudly(tmp_path: Path) -> None:
    torch.manual_seed(0)
    untrained = tmp_path / "untrained.safetensors"  # BatchNorm statistics never updated
    save_checkpoint(timm.create_model("test_resnet", num_classes=10), untrained, "test_resnet",
                    {"num_classes": 10})
    model = _model(untrained)
    choice = measure(model.choice, model.net, builtin("digits").train.images[:128], None, CPU)
    assert choice.info.source == "undetermined"
    assert choice.info.note.startswith("UNDETERMINED")
    report = run(spec(untrained, untrained, objectives=["dm"], protocols=["standard"],
                      layers=layers("layer2"), train=TINY), tmp_path)
    assert report.front.preprocess is not None
    assert report.front.preprocess.source == "undetermined"
    assert report.warnings[0].startswith("THE FRONT MODEL'S PREPROCESSING IS UNDETERMINED")
