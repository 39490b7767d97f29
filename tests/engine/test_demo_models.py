"""The demo's committed checkpoints (issue 48): examples/demo-models holds what `stitchsim-server
demo-models --half` makes of today's recipe, its SHA256SUMS names every file scripts/demo.sh
uses, and each file loads strictly as the demo's checks load it, scoring the accuracy its
training recorded. A recipe changed without remaking the files fails here, not in the demo."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from stitchsim.models import ModelRef
from stitchsim_worker.engine.models.loading import build_model, read_metadata
from stitchsim_worker.engine.models.zoo import classifier_accuracy
from stitchsim_worker.run_command import DEMO_ARCH, DEMO_ARCH_KWARGS, DEMO_MODELS

FOLDER = Path(__file__).resolve().parents[2] / "examples" / "demo-models"


def _sums() -> dict[str, str]:
    lines = (FOLDER / "SHA256SUMS").read_text().splitlines()
    return {name: digest for digest, name in (line.split() for line in lines if line)}


def test_the_digests_name_every_demo_model_and_match() -> None:
    sums = _sums()
    assert set(sums) == set(DEMO_MODELS)
    for name, digest in sums.items():
        assert hashlib.sha256((FOLDER / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.parametrize("name", sorted(DEMO_MODELS))
def test_each_is_todays_recipe_in_float16_and_scores_its_recorded_accuracy(name: str) -> None:
    path = FOLDER / name
    meta = read_metadata(path)
    assert meta["arch"] == DEMO_ARCH
    assert json.loads(meta["arch_kwargs"]) == {"num_classes": 10, **DEMO_ARCH_KWARGS}
    with safe_open(str(path), framework="pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118
    assert "F16" in dtypes and "F32" not in dtypes, dtypes
    model = build_model(ModelRef(checkpoint={"path": str(path)}), path, "", where="front",
                        native_size=32)
    assert all(p.dtype == torch.float32 for p in model.net.parameters())
    recorded = json.loads(path.with_suffix(".json").read_text())
    dataset, _seed = DEMO_MODELS[name]
    assert recorded["dataset"] == dataset
    accuracy = classifier_accuracy(model.net, dataset)
    assert accuracy == pytest.approx(recorded["test_accuracy"], abs=1e-9)
