"""Building models from checkpoints: strict loading, metadata, and errors that say what to fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file
from stitchsim.failure import Failure
from stitchsim.models import ModelRef
from stitchsim_worker.engine import list_stitch_points
from stitchsim_worker.engine.models.loading import build_model, save_checkpoint


def _ckpt(tmp_path: Path, arch: str = "test_resnet", **kwargs: object) -> Path:
    torch.manual_seed(0)
    net = timm.create_model(arch, pretrained=False, num_classes=10, **kwargs)
    path = tmp_path / f"{arch}.safetensors"
    save_checkpoint(net, path, arch, {"num_classes": 10, **kwargs})
    return path


def _build(path: Path, **ref: object):  # type: ignore[no-untyped-def]
    return build_model(
        ModelRef(checkpoint={"path": str(path)}, **ref), path, "", where="front", native_size=32
    )


def test_arch_and_kwargs_come_from_the_checkpoint_metadata(tmp_path: Path) -> None:
    model = _build(_ckpt(tmp_path, "test_vit", img_size=32))
    assert model.arch == "test_vit"
    assert model.num_classes == 10
    assert model.preprocess.input_size == 32
    assert not model.net.training
    assert not any(p.requires_grad for p in model.net.parameters())


def test_unknown_and_remote_architectures_are_refused(tmp_path: Path) -> None:
    path = _ckpt(tmp_path)
    with pytest.raises(Failure, match="not a timm architecture"):
        _build(path, arch="resnet_does_not_exist")
    with pytest.raises(ValueError, match="plain timm model name"):
        ModelRef(checkpoint="sha256:00", arch="hf-hub:timm/resnet18.a1_in1k")


def test_weights_that_do_not_fit_name_the_keys_and_shapes(tmp_path: Path) -> None:
    path = _ckpt(tmp_path)
    with pytest.raises(Failure) as e:
        _build(path, arch="test_resnet", arch_kwargs={"num_classes": 7})
    assert "fc.weight: checkpoint (10, 96) vs model (7, 96)" in e.value.message
    with pytest.raises(Failure) as e:
        _build(path, arch="test_convnext", arch_kwargs={"num_classes": 10})
    assert "missing keys: stem" in e.value.message and "unexpected keys" in e.value.message


def test_missing_arch_and_bad_metadata_are_explained(tmp_path: Path) -> None:
    bare = tmp_path / "bare.safetensors"
    save_file({"w": torch.zeros(2)}, str(bare))
    with pytest.raises(Failure, match="no architecture given"):
        _build(bare)
    bad = tmp_path / "bad.safetensors"
    save_file(
        {"w": torch.zeros(2)}, str(bad), metadata={"arch": "test_resnet", "arch_kwargs": "{oops"}
    )
    with pytest.raises(Failure, match="not valid JSON"):
        _build(bad)


def test_pickle_and_garbage_files_are_refused(tmp_path: Path) -> None:
    pickled = tmp_path / "model.safetensors"
    torch.save({"w": torch.zeros(2)}, pickled)
    with pytest.raises(Failure, match="not a readable safetensors file"):
        _build(pickled, arch="test_resnet")


def test_ddp_prefixed_checkpoints_load(tmp_path: Path) -> None:
    net = timm.create_model("test_resnet", pretrained=False, num_classes=10)
    path = tmp_path / "ddp.safetensors"
    save_file(
        {f"module.{k}": v.contiguous() for k, v in net.state_dict().items()},
        str(path),
        metadata={"arch": "test_resnet", "arch_kwargs": json.dumps({"num_classes": 10})},
    )
    assert _build(path).arch == "test_resnet"


def test_listing_stitch_points() -> None:
    points = list_stitch_points("test_resnet", {"num_classes": 10})
    assert points["stages"] == ["act1", "layer1", "layer2", "layer3", "layer4"]
    assert points["auto"] == ["layer1", "layer2", "layer3", "layer4"]
    assert "layer2.0.conv1" in points["all"]
    vit = list_stitch_points("test_vit", {"img_size": 32})
    assert vit["auto"][-1] == "blocks.5" and len(vit["auto"]) == 4
