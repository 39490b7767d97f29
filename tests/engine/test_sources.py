"""Model sources (issue 28): torchvision, transformers and timm-hub checkpoints and the
project's own architectures are built by their source, load their weights exactly, list stitch
points inside blocks as well as stage outputs, and stitch, alone and across sources. Tiny
models, random weights, nothing downloaded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from stitchsim.failure import Failure
from stitchsim.models import ModelRef
from stitchsim_worker.engine import list_stitch_points
from stitchsim_worker.engine.models.loading import build_model

from tests.engine.jobs import layers, rows, run, spec
from tests.engine.model_folders import (
    CONVNEXT,
    VIT,
    hf_folder,
    packed,
    timm_hub_folder,
    torchvision_file,
)

TINY = {"epochs": 1, "max_train_samples": 64, "max_test_samples": 64}
# (a point inside a block, a stage output) per model: the identity check stitches at both.
POINTS = {
    "torchvision:resnet18": ("layer2.0.conv2", "layer3"),
    "torchvision:mobilenet_v3_small": ("features.4.block.1", "features.8"),
    "transformers:ViTForImageClassification": ("vit.layers.0.mlp.fc1", "vit.layers.1"),
    "transformers:ConvNextForImageClassification": (
        "convnext.encoder.stages.0.layers.0.pwconv1", "convnext.encoder.stages.1"),
    "test_resnet": ("layer2.0.conv2", "layer3"),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("sources")
    return {
        "torchvision:resnet18": torchvision_file(tmp, "resnet18"),
        "torchvision:mobilenet_v3_small": torchvision_file(tmp, "mobilenet_v3_small"),
        "transformers:ViTForImageClassification": packed(
            hf_folder(tmp, "ViTForImageClassification", VIT, processor=True)),
        "transformers:ConvNextForImageClassification": packed(
            hf_folder(tmp, "ConvNextForImageClassification", CONVNEXT)),
        "test_resnet": packed(timm_hub_folder(tmp)),
    }


def _build(path: Path, **ref: object):  # type: ignore[no-untyped-def]
    return build_model(ModelRef(checkpoint={"path": str(path)}, **ref), path, "",
                       where="front", native_size=32)


def test_each_source_builds_its_architecture_from_the_file_alone(models: dict[str, Path]) -> None:
    for arch, path in models.items():
        model = _build(path)
        assert model.arch == arch and model.num_classes == 10
        assert model(torch.rand(2, 3, 32, 32)).shape == (2, 10)
    assert _build(models["torchvision:resnet18"]).source == "torchvision"
    assert _build(models["test_resnet"]).source == "timm"


def test_a_save_pretrained_folder_loads_the_very_weights_it_was_saved_with(tmp_path: Path
                                                                           ) -> None:
    import transformers

    folder = hf_folder(tmp_path, "ViTForImageClassification", VIT, seed=3)
    reference = transformers.ViTForImageClassification.from_pretrained(
        folder, local_files_only=True).eval()
    model = _build(packed(folder), preprocess="none")
    x = torch.rand(4, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(model.net(x), reference(x).logits, atol=1e-5)


def test_sharded_folders_pack_into_one_file_that_loads(tmp_path: Path) -> None:
    import transformers

    torch.manual_seed(0)
    net = transformers.ConvNextForImageClassification(transformers.ConvNextConfig(**CONVNEXT))
    folder = tmp_path / "sharded"
    net.save_pretrained(folder, max_shard_size="20KB")
    assert (folder / "model.safetensors.index.json").is_file()
    assert len(list(folder.glob("model-*.safetensors"))) > 1
    model = _build(packed(folder), preprocess="none")
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(model.net(x), net.eval()(x).logits, atol=1e-5)


def test_the_source_config_gives_the_preprocessing_and_the_report_says_where_from(
    models: dict[str, Path],
) -> None:
    vit = _build(models["transformers:ViTForImageClassification"])
    assert vit.choice.info.source == "config"
    assert vit.preprocess.mean == (0.5, 0.4, 0.3) and vit.preprocess.std == (0.2, 0.2, 0.2)
    assert vit.info.metadata["layout"] == "transformers"
    hub = _build(models["test_resnet"])
    assert hub.choice.info.source == "config" and hub.preprocess.mean == (0.3, 0.3, 0.3)
    assert hub.arch_kwargs["num_classes"] == 10 and hub.info.metadata["layout"] == "timm"
    assert _build(models["test_resnet"], preprocess="none").choice.info.source == "spec"
    # torchvision's convention is its weights' transforms: measured first among candidates.
    tv = _build(models["torchvision:resnet18"])
    assert tv.choice.pending[0][0] == "torchvision"
    assert tv.choice.pending[0][1] == pytest.approx((0.485, 0.456, 0.406))


@pytest.mark.parametrize("arch", list(POINTS)[:4])
def test_points_inside_blocks_and_stage_outputs_are_listed(arch: str) -> None:
    from tests.engine.model_folders import CONVNEXT, VIT

    kwargs = {"transformers:ViTForImageClassification": VIT,
              "transformers:ConvNextForImageClassification": CONVNEXT}.get(arch,
                                                                           {"num_classes": 10})
    points = list_stitch_points(arch, kwargs)
    inside, stage = POINTS[arch]
    assert inside in points["all"] and stage in points["all"]
    assert stage in points["stages"] and inside not in points["stages"]
    assert len(points["auto"]) >= 2


@pytest.mark.parametrize("arch", list(POINTS))
def test_a_model_stitched_into_itself_agrees_with_itself(
    arch: str, models: dict[str, Path], tmp_path: Path
) -> None:
    path = models[arch]
    report = run(spec(path, path, objectives=["dm"], protocols=["standard"],
                      layers=layers(*POINTS[arch]), train=TINY), tmp_path)
    for row in rows(report, objective="dm"):
        assert row.agreement >= 0.99, (arch, row.front_layer, row.agreement)
    assert report.front.source == (arch.split(":")[0] if ":" in arch else "timm")


def test_torchvision_and_transformers_models_stitch_in_both_directions(
    models: dict[str, Path], tmp_path: Path
) -> None:
    tv, hf = models["torchvision:mobilenet_v3_small"], models[
        "transformers:ConvNextForImageClassification"]
    pairs = [{"front": "features.4", "back": "convnext.encoder.stages.0"}]
    s = spec(tv, hf, objectives=["dm"], protocols=["standard"], layers=pairs, train=TINY)
    report = run(s.model_copy(update={"directions": "both"}), tmp_path)
    directions = {r.direction for r in rows(report, objective="dm")}
    assert directions == {"front_to_back", "back_to_front"}
    assert report.front.source == "torchvision" and report.back.source == "transformers"
    for row in rows(report, objective="dm"):
        assert 0.0 <= row.agreement <= 1.0


def test_unknown_architectures_of_each_source_name_the_source(models: dict[str, Path]) -> None:
    path = models["torchvision:resnet18"]
    with pytest.raises(Failure, match="not a torchvision architecture; similar names: "
                                      "resnet18"):
        _build(path, arch="torchvision:resnet181")
    with pytest.raises(Failure, match="not a Hugging Face transformers architecture"):
        _build(path, arch="transformers:NoSuchModelForImageClassification")
    with pytest.raises(ValueError, match="plain timm model name or SOURCE:NAME"):
        ModelRef(checkpoint="sha256:00", arch="hf-hub:timm/resnet18.a1_in1k")
    with pytest.raises(ValueError, match="plain timm model name or SOURCE:NAME"):
        ModelRef(checkpoint="sha256:00", arch="torchvision:../../etc")


def test_a_local_run_takes_a_model_folder_as_it_is(tmp_path: Path) -> None:
    folder = hf_folder(tmp_path, "ConvNextForImageClassification", CONVNEXT, seed=1)
    report = run(spec(folder, folder, objectives=["dm"], protocols=["standard"],
                      layers=layers("convnext.encoder.stages.0"), train=TINY), tmp_path)
    assert report.front.arch == "transformers:ConvNextForImageClassification"
    assert report.front.source_metadata["layout"] == "transformers"
    assert all(r.agreement >= 0.99 for r in rows(report, objective="dm"))


def test_the_submission_check_builds_every_source_on_the_meta_device(
    models: dict[str, Path], tmp_path: Path
) -> None:
    from stitchsim_worker.engine import Resources, check_spec

    tv, vit = models["torchvision:mobilenet_v3_small"], models[
        "transformers:ViTForImageClassification"]
    pairs = [{"front": "features.4", "back": "vit.layers.0"}]
    checked = check_spec(spec(tv, vit, layers=pairs), resources=Resources(cache_dir=tmp_path))
    assert checked.units > 0
    checked = check_spec(spec(models["test_resnet"], tv, layers="auto"),
                         resources=Resources(cache_dir=tmp_path))
    assert checked.units > 0


def test_a_worker_warm_up_imports_what_each_sources_first_build_would() -> None:
    import sys

    from stitchsim_worker.engine.warm import warm_up

    took = warm_up()
    assert {"torchvision", "transformers", "builtin data"} <= set(took)
    for module in ("transformers.modeling_utils", "transformers.models.auto.modeling_auto",
                   "sklearn.datasets"):
        assert module in sys.modules, module


@pytest.mark.parametrize("arch", ["torchvision:resnet18", "torchvision:mobilenet_v3_small",
                                  "test_resnet"])
def test_a_bare_state_dict_gets_its_class_count_from_its_head(tmp_path: Path, arch: str) -> None:
    """A fine-tuned model saved as a bare state dict (no metadata) with only its architecture
    named: the head's rows say 7 classes, and the same file's weights load exactly."""
    from safetensors.torch import save_file
    from stitchsim_worker.engine.models.loading import random_model

    net = random_model(arch, {"num_classes": 7}).net
    path = tmp_path / "bare.safetensors"
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(path))
    model = _build(path, arch=arch, preprocess="none")
    assert model.num_classes == 7 and model.arch_kwargs == {"num_classes": 7}
    x = torch.rand(2, 3, 32, 32)
    assert torch.equal(model.net(x), net(x))
    # The submission check (on the meta device) reads it the same way.
    from stitchsim_worker.engine.models.loading import meta_model
    checked = meta_model(ModelRef(checkpoint={"path": str(path)}, arch=arch, preprocess="none"),
                         path, where="front", native_size=32)
    assert checked.arch_kwargs == {"num_classes": 7} and checked.num_classes == 7
    # A checkpoint that differs beyond its head is still refused, naming the keys.
    shapes = {k: v.contiguous() for k, v in net.state_dict().items()}
    first = next(k for k, v in shapes.items() if v.dim() == 4)
    shapes[first] = torch.zeros(1, *shapes[first].shape[1:])
    save_file(shapes, str(path))
    with pytest.raises(Failure, match="weights_mismatch|does not fit") as e:
        _build(path, arch=arch, preprocess="none")
    assert first in e.value.message
