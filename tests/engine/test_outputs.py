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
from stitchsim_worker.engine.models.zoo import make_autoencoder_checkpoint

from tests.engine.jobs import TINY, layers, rows, run, spec

AE_TRAINING = {"epochs": 4, "arch_kwargs": {"width": 8, "latent": 8}}
FIT = {"epochs": 2, "max_train_samples": 200, "max_test_samples": 120}


@pytest.fixture(scope="module")
def autoencoders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The conv autoencoder trained on digits and on shapes (a few epochs: enough to draw)."""
    root = tmp_path_factory.mktemp("autoencoders")
    out = {}
    for task in ("digits", "shapes"):
        out[task] = root / f"ae_{task}.safetensors"
        make_autoencoder_checkpoint(out[task], task, **AE_TRAINING)
    return out


def test_the_engine_has_one_entry_per_output_kind_and_detects_them() -> None:
    assert list(OUTPUTS) == list(catalogue.OUTPUT_KINDS.names)
    assert detect_kind((10,), 10) == "logits"
    assert detect_kind((64,), 0) == "embedding"
    assert detect_kind((3, 32, 32), 0) == "image"
    assert AUTOENCODER in architectures()


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


def test_an_autoencoder_stitched_into_itself_reconstructs_as_it_does(
    tmp_path: Path, autoencoders: dict[str, Path],
) -> None:
    ae = autoencoders["digits"]
    s = spec(ae, ae, objectives=["dm", "slm"], protocols=["standard"], controls=["identity"],
             layers=layers("encoder"), train=FIT)
    report = run(s, tmp_path)
    assert report.back.output == "image" and report.back.output_source == "metadata"
    assert report.back.preprocess is not None and report.back.preprocess.name == "none"
    (dm,) = rows(report, control="identity", objective="dm")
    assert dm.agreement >= 0.99 and dm.psnr is not None and dm.psnr > 35
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
    assert row.output == "image" and 0 <= row.agreement <= 1 and row.psnr is not None
    assert row.grid is not None and len(row.grid.labels) == 4
    assert "paired class" in row.grid.labels[2]
    note = next(n for n in report.notes if "compatibility" in n and "image" in n)
    assert f"{floor.agreement:.3f}" in note and "not shared meaning" in note
    page = render_report_page(report)
    assert 'id="grid-0"' in page and "data:image/png;base64," in page
    assert "1 - relative error" in page and "PSNR" in page


class _PooledDinov2(torch.nn.Module):
    """A transformers Dinov2Model from a tiny config (random weights, no download), read as an
    embedder: its pooled output (the CLS token after the last norm)."""

    num_classes = 0

    def __init__(self) -> None:
        super().__init__()
        from transformers import Dinov2Config, Dinov2Model

        self.model = Dinov2Model(Dinov2Config(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            image_size=32, patch_size=8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=x).pooler_output


def test_a_transformers_dinov2_embedder_stitched_into_itself_agrees(tmp_path: Path) -> None:
    # Built through the timm bridge of the autoencoder module: the transformers model source
    # (branch `sources`) is not on this branch; with it, the same Dinov2Model loads from its
    # save_pretrained folder instead.
    from stitchsim_worker.engine.models.autoencoder import _expose_to_timm

    if not timm.is_model("test_dinov2_embedder"):
        _expose_to_timm("test_dinov2_embedder", _PooledDinov2)
    torch.manual_seed(0)
    ckpt = tmp_path / "dinov2.safetensors"
    save_checkpoint(_PooledDinov2(), ckpt, "test_dinov2_embedder", {}, preprocess="none")
    s = spec(ckpt, ckpt, objectives=["dm"], protocols=["standard"], controls=["identity"],
             layers=layers("model.encoder.layer.0"), train=TINY)
    report = run(s, tmp_path / "cache")
    assert report.back.output == "embedding" and report.back.accuracy is None
    (dm,) = rows(report, control="identity", objective="dm")
    assert dm.agreement >= 0.99 and dm.hard_agreement >= 0.95
