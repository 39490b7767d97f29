"""`stitchsim check` of Hugging Face folders as a user runs it (issue 28): two folders written by
`save_pretrained` (a tiny ViT with its image processor, a tiny ConvNeXt; random weights),
passed as they are, with no --arch and no config flags, through the real gateway and workers
(`stitchsim-server serve`). The job is small (one stitch pair, dm, one epoch on 64 samples):
what is tested is that the folders are packed, stored with their config, built by the
transformers source and compared (the models being untrained, without a verdict)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stitchsim.models import Report

from tests.client.test_e2e import service_args, stitchsim
from tests.engine.model_folders import CONVNEXT, VIT, hf_folder

SMALL_JOB = [
    "--layers", "vit.layers.1:convnext.encoder.stages.0",
    "--objectives", "dm", "--protocols", "standard", "--directions", "front_to_back",
    "--set", "train.epochs=1", "--set", "train.max_train_samples=64",
    "--set", "train.max_test_samples=64",
]  # fmt: skip
THRESHOLD = 0.5


def test_check_compares_two_save_pretrained_folders_with_no_model_flags(
    live_service: Any, tmp_path: Path,
) -> None:
    vit = hf_folder(tmp_path, "ViTForImageClassification", VIT, processor=True)
    convnext = hf_folder(tmp_path, "ConvNextForImageClassification", CONVNEXT)
    assert (vit / "config.json").is_file() and (vit / "model.safetensors").is_file()
    out = tmp_path / "report.json"
    run = stitchsim("check", str(vit), str(convnext), *service_args(live_service),
                    "--threshold", str(THRESHOLD), *SMALL_JOB, "--json", str(out),
                    "--timeout", "240")
    assert out.is_file(), run.err
    report = Report.model_validate_json(out.read_text())
    # Random weights: both models guess on digits, so the engine withholds the verdict and
    # says why; `check` exits 2 (the figures cannot be trusted), not 0 or 1.
    assert report.front.near_chance and report.verdict is None and report.verdict_reason
    assert run.code == 2 and f"NO VERDICT: {report.verdict_reason}" in run.out, run.err
    front, back = report.front, report.back
    assert front.arch == "transformers:ViTForImageClassification"
    assert back.arch == "transformers:ConvNextForImageClassification"
    assert front.source == back.source == "transformers"
    assert front.source_metadata["layout"] == "transformers"
    # The image processor saved beside the ViT decides its preprocessing, not a measurement.
    assert front.preprocess is not None and front.preprocess.source == "config"
    assert front.preprocess.mean == (0.5, 0.4, 0.3)
    assert front.output == back.output == "logits"
    (row,) = [r for r in report.results if r.objective == "dm"]
    assert (row.front_layer, row.back_layer) == ("vit.layers.1", "convnext.encoder.stages.0")
    assert 0 <= row.agreement <= 1
    assert "transformers:ViTForImageClassification" in run.out + run.err
