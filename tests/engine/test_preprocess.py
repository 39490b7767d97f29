"""Preprocessing that is right by default and says what it did (issue 12): a model trained by
plain PyTorch code on unnormalised [0,1] pixels, uploaded with only its architecture, must be
evaluated the way it was trained; a model that cannot solve the dataset gets a loud warning
and no verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from stitchsim.models import ModelRef
from stitchsim_worker.engine.data.datasets import builtin
from stitchsim_worker.engine.models.loading import build_model

from tests.engine.jobs import layers, run, spec

QUICK = {"epochs": 1, "max_train_samples": 300, "max_test_samples": 200}


def _train_plain(path: Path) -> float:
    """Training code that is not ours: raw [0,1] pixels in, no mean/std anywhere."""
    torch.manual_seed(0)
    net = timm.create_model("test_resnet", pretrained=False, num_classes=10)
    ds = builtin("digits")
    x, y = ds.train.images, ds.train.labels
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    net.train()
    for _ in range(4):
        for idx in torch.randperm(len(y)).split(64):
            loss = F.cross_entropy(net(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    net.eval()
    with torch.no_grad():
        acc = float((net(ds.test.images).argmax(-1) == ds.test.labels).float().mean())
    _save(path, net.state_dict())
    return acc


def _save(path: Path, sd: dict[str, torch.Tensor], **metadata: str) -> None:
    meta = {"arch": "test_resnet", "arch_kwargs": json.dumps({"num_classes": 10}), **metadata}
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path), metadata=meta)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    path = tmp_path_factory.mktemp("plain") / "plain.safetensors"
    return path, _train_plain(path)


def test_an_unnormalised_model_gets_its_true_accuracy_without_spec_changes(
    plain: tuple[Path, float], tmp_path: Path
) -> None:
    path, trained_acc = plain
    assert trained_acc >= 0.9
    report = run(spec(path, path, objectives=["dm"], protocols=["standard"],
                      layers=layers("layer2"), train=QUICK, threshold=0.9), tmp_path)
    pre = report.front.preprocess
    assert pre is not None and pre.source == "measured" and pre.name == "none"
    assert pre.mean == (0.0, 0.0, 0.0) and pre.std == (1.0, 1.0, 1.0)
    scores = {c.name: c.accuracy for c in pre.candidates}
    # test_resnet's own config is 0.5/0.5, so "inception" is the same candidate as "timm".
    assert set(scores) == {"timm", "none"} and pre.samples == 300
    assert scores["none"] >= 0.9 > scores["timm"] + 0.2, scores
    assert "none predicts best" in pre.note
    # The figures are computed the way the model was trained.
    assert report.front.accuracy >= trained_acc - 0.05
    assert not report.front.near_chance and report.verdict == "similar"
    assert report.results[0].agreement >= 0.99


def test_explicit_fields_and_metadata_win_over_measurement(
    plain: tuple[Path, float], tmp_path: Path
) -> None:
    path, _ = plain

    def build(p: Path, **ref: object):  # type: ignore[no-untyped-def]
        return build_model(ModelRef(checkpoint={"path": str(p)}, **ref), p, "", where="front",
                           native_size=32).choice

    forced = build(path, preprocess="timm")
    assert forced.info.source == "spec" and forced.info.name == "timm" and not forced.pending
    custom = build(path, mean=(0.1, 0.1, 0.1), std=(0.2, 0.2, 0.2))
    assert custom.info.source == "spec" and custom.info.name == "custom"
    assert custom.preprocess.std == (0.2, 0.2, 0.2)
    assert build(path).pending  # nothing said: to be measured on labelled samples

    weights = load_file(str(path))
    declared = tmp_path / "declared.safetensors"
    _save(declared, weights, preprocess="none")
    info = build(declared).info
    assert info.source == "metadata" and info.name == "none" and "preprocess" in info.note
    stats = tmp_path / "stats.safetensors"
    _save(stats, weights, mean="[0.5, 0.5, 0.5]", std="[0.25, 0.25, 0.25]")
    assert build(stats).preprocess.mean == (0.5, 0.5, 0.5)
    assert build(stats, preprocess="none").info.source == "spec"  # the spec wins


def test_a_model_at_chance_is_flagged_and_gets_no_verdict(
    plain: tuple[Path, float], tmp_path: Path
) -> None:
    # Digits models know nothing of class-clustered noise: chance whatever the preprocessing.
    path, _ = plain
    report = run(spec(path, path, dataset="clustered_noise", objectives=["dm"],
                      protocols=["standard"], layers=layers("layer2"), train=QUICK,
                      threshold=0.5), tmp_path)
    assert report.front.near_chance and report.back.near_chance
    assert report.front.chance_accuracy == pytest.approx(0.1)
    # Written once, by the engine, in the model's summary (not again among the job's warnings).
    assert report.front.chance_warning is not None
    assert report.front.chance_warning.startswith("THE FRONT MODEL IS AT CHANCE")
    assert not any("AT CHANCE" in w for w in report.warnings)
    assert report.verdict is None
    assert report.verdict_reason is not None and "chance" in report.verdict_reason
    assert "preprocessing" in report.verdict_reason


def test_candidates_are_the_architecture_config_plain_pixels_and_half() -> None:
    from stitchsim_worker.engine.models.preprocess import candidates

    names = {n: (m, s) for n, m, s in candidates(timm.create_model("resnet18"))}
    assert list(names) == ["timm", "none", "inception"]
    assert names["timm"][0] == pytest.approx((0.485, 0.456, 0.406))
    vit = candidates(timm.create_model("test_vit", img_size=32))
    assert [n for n, _, _ in vit] == ["timm", "none"]  # its config is 0.5/0.5 already


def test_images_too_small_for_any_model_are_refused_with_what_to_do(
    plain: tuple[Path, float], tmp_path: Path
) -> None:
    from stitchsim.failure import Failure
    from stitchsim_worker.engine import Resources, check_spec

    g = torch.Generator().manual_seed(0)
    tiny = tmp_path / "tiny.safetensors"
    save_file({
        "train_images": torch.randint(0, 255, (40, 3, 1, 1), generator=g, dtype=torch.uint8),
        "train_labels": torch.arange(40) % 10,
        "test_images": torch.randint(0, 255, (20, 3, 1, 1), generator=g, dtype=torch.uint8),
        "test_labels": torch.arange(20) % 10,
    }, str(tiny))
    path, _ = plain
    s = spec(path, path, dataset={"path": str(tiny)}, layers=layers("layer2"))
    with pytest.raises(Failure) as e:
        check_spec(s, resources=Resources(cache_dir=tmp_path))
    assert e.value.code == "images_too_small"
    assert "1x1 px" in e.value.message and "front.input_size" in e.value.message
    upsampled = s.model_copy(update={"front": s.front.model_copy(update={"input_size": 16}),
                                     "back": s.back.model_copy(update={"input_size": 16})})
    check_spec(upsampled, resources=Resources(cache_dir=tmp_path))
