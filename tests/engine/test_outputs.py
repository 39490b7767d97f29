"""Models that are not classifiers (issue 28): embedding and image output kinds, scored and
trained their own way, and the autoencoder experiment of "Functional Alignment Can Mislead"
(an encoder of one task stitched into the decoder of another) end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file
from stitchsim import catalogue
from stitchsim.failure import Failure
from stitchsim.models import Spec
from stitchsim_service.gateway.pages import render_report_page
from stitchsim_worker.engine.data.datasets import builtin
from stitchsim_worker.engine.job.prepare import labels_needed
from stitchsim_worker.engine.measures.outputs import OUTPUTS, detect_kind
from stitchsim_worker.engine.measures.pseudo import pseudo_classes
from stitchsim_worker.engine.models.autoencoder import AUTOENCODER
from stitchsim_worker.engine.models.builtin import architectures
from stitchsim_worker.engine.models.loading import save_checkpoint

from tests.engine.jobs import TINY, layers, rows, run, spec
from tests.engine.model_folders import CLIP_VISION, DINOV2, hf_folder, packed

FIT = {"epochs": 2, "max_train_samples": 200, "max_test_samples": 120}


def test_the_engine_has_one_entry_per_output_kind_and_detects_them() -> None:
    assert list(OUTPUTS) == list(catalogue.OUTPUT_KINDS.names)
    assert detect_kind((10,), 10) == "logits"
    assert detect_kind((64,), 0) == "embedding"
    assert detect_kind((3, 32, 32), 0) == "image"
    assert AUTOENCODER == "stitchsim:conv_autoencoder" and "conv_autoencoder" in architectures()


@pytest.mark.parametrize("kind", ["embedding", "image"])
def test_a_stitch_that_ignores_its_input_fails_the_figures_a_faithful_one_passes(
    kind: str,
) -> None:
    g = torch.Generator().manual_seed(0)
    shape = (200, 32) if kind == "embedding" else (200, 3, 8, 8)
    # Outputs that share a large common part, as real features do (post-ReLU, an image's
    # background): the mean alone is already close in cosine to every sample.
    back = 2.0 + torch.randn(shape, generator=g).abs()
    score = OUTPUTS[kind].score
    same = score(back.clone(), back, torch.zeros(200, dtype=torch.long), 0)
    assert same.values["agreement"] >= 0.999 and same.values["hard_agreement"] == 1.0
    constant = back.mean(0, keepdim=True).expand_as(back)
    shuffled = back[torch.randperm(200, generator=g)]
    for ignoring in (constant, shuffled):
        s = score(ignoring, back, torch.zeros(200, dtype=torch.long), 0)
        assert s.values["hard_agreement"] <= 0.02  # retrieves nothing of its own
        assert s.values["agreement"] < same.values["agreement"] - 0.02
        assert s.ci["agreement"][1] < same.values["agreement"]
    if kind == "image":
        assert same.values["psnr"] == pytest.approx(100.0)
        assert score(constant, back, torch.zeros(200, dtype=torch.long), 0).values["psnr"] < 30


def test_pseudo_classes_recover_separated_clusters() -> None:
    g = torch.Generator().manual_seed(0)
    centres = torch.eye(4) * 5
    truth = torch.arange(200) % 4
    points = centres[truth] + 0.1 * torch.randn(200, 4, generator=g)
    train, test = pseudo_classes(points[:150], points[150:], seed=0, k=4)
    # The same partition up to the names of the clusters.
    mapping = {int(t): int(p) for t, p in zip(truth[:150], train, strict=True)}
    assert len(set(mapping.values())) == 4
    assert all(mapping[int(t)] == int(p) for t, p in zip(truth[150:], test, strict=True))


def _unlabelled_digits(path: Path) -> None:
    """Built-in digits as an upload without labels (uint8, no label arrays)."""
    ds = builtin("digits")

    def u8(x: torch.Tensor) -> torch.Tensor:
        return (x * 255).round().to(torch.uint8).contiguous()

    save_file({"train_images": u8(ds.train.images[:200]), "test_images": u8(ds.test.images)},
              str(path))


def test_an_embedding_model_stitched_into_itself_agrees_on_unlabelled_data(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    net = timm.create_model("test_resnet", pretrained=False, num_classes=0)
    ckpt = tmp_path / "embedder.safetensors"
    save_checkpoint(net, ckpt, "test_resnet", {"num_classes": 0}, preprocess="none")
    data = tmp_path / "unlabelled.safetensors"
    _unlabelled_digits(data)
    s = spec(ckpt, ckpt, dataset={"path": str(data)}, objectives=["dm", "slm"],
             protocols=["standard"], controls=["identity", "clustered_noise"],
             layers=layers("layer2"), train=TINY, control_settings={"noise_sigmas": [0.3]})
    assert labels_needed(s, {"front": "embedding", "back": "embedding"}) == []
    report = run(s, tmp_path / "cache")
    assert report.back.output == "embedding" and report.back.output_source == "detected"
    assert report.back.accuracy is None and report.dataset["labelled"] is False
    (dm,) = rows(report, control="identity", objective="dm")
    assert dm.output == "embedding" and dm.accuracy is None
    assert dm.agreement >= 0.99 and dm.hard_agreement >= 0.95
    (slm,) = rows(report, control="identity", objective="slm")
    assert slm.agreement >= 0.95
    # The floor runs on pseudo-classes (no labels) and stays below the ceiling.
    (floor,) = rows(report, control="clustered_noise", objective="dm")
    assert floor.hard_agreement < 0.5 and floor.agreement < dm.agreement
    page = render_report_page(report)
    assert "cosine similarity" in page and "retrieval agreement" in page


def test_class_score_objectives_are_refused_for_a_model_without_classes(
    tmp_path: Path, autoencoders: dict[str, Path],
) -> None:
    s = spec(autoencoders["digits"], autoencoders["digits"], objectives=["hlm"],
             protocols=["standard"], layers=layers("encoder"), train=TINY)
    with pytest.raises(Failure) as e:
        run(s, tmp_path)
    assert e.value.code == "invalid_spec" and "objective hlm" in e.value.message


def test_a_checkpoint_naming_the_autoencoder_without_its_source_still_builds(
    tmp_path: Path, autoencoders: dict[str, Path],
) -> None:
    """Checkpoints saved before the project's own source say `arch: conv_autoencoder`: timm
    does not know the name, so it falls to the project's own architectures."""
    from safetensors import safe_open
    from stitchsim.models import ModelRef
    from stitchsim_worker.engine.models.loading import build_model

    with safe_open(str(autoencoders["digits"]), framework="pt") as f:
        meta = {**f.metadata(), "arch": "conv_autoencoder"}
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no iter
    legacy = tmp_path / "legacy.safetensors"
    save_file(tensors, str(legacy), metadata=meta)
    loaded = {}
    for name, path in (("legacy", legacy), ("current", autoencoders["digits"])):
        loaded[name] = build_model(ModelRef(checkpoint={"path": str(path)}), path, "",
                                   where="back", native_size=32)
        assert loaded[name].source == "stitchsim" and loaded[name].output == "image"
    assert not timm.is_model("conv_autoencoder")  # no bridge into timm's registry
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded["legacy"](x), loaded["current"](x))


def test_an_autoencoder_stitched_into_itself_reconstructs_as_it_does(
    tmp_path: Path, autoencoders: dict[str, Path],
) -> None:
    ae = autoencoders["digits"]
    s = spec(ae, ae, objectives=["dm", "slm"], protocols=["standard"], controls=["identity"],
             layers=layers("encoder"), train=FIT)
    report = run(s, tmp_path)
    assert report.back.output == "image" and report.back.output_source == "metadata"
    assert report.back.arch == AUTOENCODER and report.back.source == "stitchsim"
    assert report.back.preprocess is not None and report.back.preprocess.name == "none"
    (dm,) = rows(report, control="identity", objective="dm")
    assert dm.agreement >= 0.99 and (dm.value("psnr") or 0.0) > 35
    assert dm.hard_agreement >= 0.95
    (slm,) = rows(report, control="identity", objective="slm")
    assert slm.agreement >= 0.9
    # The standard rows draw: a grid of inputs, the back model's and the stitched model's.
    (drawn,) = [r for r in report.results if r.grid is not None]
    assert drawn.objective == "dm" and drawn.grid is not None
    assert drawn.grid.labels[0] == "inputs" and len(drawn.grid.labels) == 3
    Spec.model_validate(json.loads(report.spec.model_dump_json()))  # the report round-trips


def test_the_autoencoder_experiment_draws_the_back_task_from_the_front_tasks_inputs(
    tmp_path: Path, autoencoders: dict[str, Path],
) -> None:
    """Functional Alignment Can Mislead: a shapes encoder stitched into a digits decoder is
    trained to draw the paired digit class from each shape; it measures compatibility, and
    the report sets it beside the clustered-noise floor."""
    s = spec(autoencoders["shapes"], autoencoders["digits"], dataset="digits",
             front_dataset="shapes", protocols=["cross_task"], objectives=["slm"],
             layers=layers("encoder"), train=FIT,
             control_settings={"noise_sigmas": [0.3]})
    report = run(s, tmp_path)
    (row,) = rows(report, protocol="cross_task", control=None)
    (floor,) = rows(report, control="clustered_noise")
    assert row.output == "image" and 0 <= row.agreement <= 1 and row.value("psnr") is not None
    assert row.grid is not None and len(row.grid.labels) == 4
    assert "paired class" in row.grid.labels[2]
    note = next(n for n in report.notes if "compatibility" in n and "image" in n)
    assert f"{floor.agreement:.3f}" in note and "not shared meaning" in note
    page = render_report_page(report)
    assert 'id="grid-0"' in page and "data:image/png;base64," in page
    assert "1 - relative error" in page and "PSNR" in page


@pytest.fixture(scope="module")
def hf_embedders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A Dinov2Model and a CLIPVisionModel from tiny configs (random weights), saved with
    save_pretrained and packed as the SDK uploads a folder."""
    tmp = tmp_path_factory.mktemp("hf_embedders")
    return {"dinov2": packed(hf_folder(tmp, "Dinov2Model", DINOV2)),
            "clip": packed(hf_folder(tmp, "CLIPVisionModel", CLIP_VISION))}


def test_a_transformers_dinov2_folder_is_an_embedder_that_agrees_with_itself(
    tmp_path: Path, hf_embedders: dict[str, Path],
) -> None:
    dinov2 = hf_embedders["dinov2"]
    s = spec(dinov2, dinov2, objectives=["dm"], protocols=["standard"], controls=["identity"],
             layers=layers("encoder.layer.0"), train=TINY)
    report = run(s, tmp_path / "cache")
    assert report.back.arch == "transformers:Dinov2Model" and report.back.source == "transformers"
    assert report.back.source_metadata["layout"] == "transformers"
    assert report.back.output == "embedding" and report.back.output_source == "detected"
    assert report.back.accuracy is None
    for dm in rows(report, objective="dm"):
        assert dm.agreement >= 0.99 and dm.hard_agreement >= 0.95


def test_a_clip_vision_encoder_is_an_embedder_another_model_stitches_into(
    tmp_path: Path, hf_embedders: dict[str, Path],
) -> None:
    """Dinov2 into CLIP: CLIP's identity is the ceiling; the cross-model stitch retrieves its
    own input's CLIP embedding far more often than the clustered-noise floor (or chance) does.
    Random-weight transformers' pooled outputs share most of their direction, so the mean
    cosine is high for any stitch: retrieval is the figure that needs the input."""
    s = spec(hf_embedders["dinov2"], hf_embedders["clip"], objectives=["dm"],
             protocols=["standard"], controls=["identity", "clustered_noise"],
             layers=[{"front": "encoder.layer.1", "back": "encoder.layers.0"}], train=TINY,
             control_settings={"noise_sigmas": [0.3]})
    report = run(s, tmp_path / "cache")
    assert report.back.arch == "transformers:CLIPVisionModel"
    assert report.back.output == "embedding" and report.back.output_source == "detected"
    (ceiling,) = rows(report, control="identity")
    assert ceiling.agreement >= 0.99 and ceiling.hard_agreement >= 0.95
    (stitched,) = rows(report, control=None)
    (floor,) = rows(report, control="clustered_noise")
    chance = 1 / TINY["max_test_samples"]
    assert stitched.output == "embedding" and 0 <= stitched.agreement <= 1
    assert stitched.agreement > floor.agreement
    assert stitched.hard_agreement >= 5 * chance
    assert stitched.hard_agreement >= floor.hard_agreement + 4 * chance
