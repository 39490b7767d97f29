"""The conv autoencoders of the autoencoder experiment, trained on digits and on shapes, as a
fixture (from the trained-fixture cache once trained)."""

from __future__ import annotations

from pathlib import Path

import pytest
from stitchsim_worker.engine.models.zoo import make_autoencoder_checkpoint

from tests.fixtures_models import TRAINING_CODE, cached_model

AE_TRAINING = {"epochs": 4, "arch_kwargs": {"width": 8, "latent": 8}}
AE_CODE = [*TRAINING_CODE, "worker/engine/models/autoencoder.py"]


@pytest.fixture(scope="module")
def autoencoders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The conv autoencoder trained on digits and on shapes (a few epochs: enough to draw),
    from the fixture cache once trained."""
    root = tmp_path_factory.mktemp("autoencoders")
    out = {}
    for task in ("digits", "shapes"):
        out[task] = root / f"ae_{task}.safetensors"

        def build(path: Path, task: str = task) -> dict[str, float]:
            return {"test_relative_error": make_autoencoder_checkpoint(path, task,
                                                                       **AE_TRAINING)}

        cached_model(f"autoencoder_{task}", {"task": task, **AE_TRAINING}, AE_CODE, build,
                     out[task])
    return out
