"""Two small models that tell a cue-conflict probe apart: one reads only the class-coloured
marker (trained on digits shuffled against their labels, each marked with its label's
marker), one reads only the digit (trained on digits marked with a random class's marker).
On digits_marker, where marker and digit agree, both are right; on
digits_marker_conflict they answer different classes. Cached like the fixture models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from stitchsim_worker.engine.data.datasets import add_marker

from tests.fixtures_models import TRAINING_CODE, cached_model

READERS = ("marker", "digit")
SETTINGS: dict[str, Any] = {"arch": "test_resnet", "dataset": "digits", "epochs": 3, "lr": 0.01}


def _marker_only(_model: Any, pixels: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The digits shuffled in the batch: only the marker says the label."""
    g = torch.Generator().manual_seed(int(labels.sum()))
    return add_marker(pixels[torch.randperm(len(pixels), generator=g)], labels)


def _digit_only(_model: Any, pixels: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """A marker of a random class on every digit: only the digit says the label."""
    g = torch.Generator().manual_seed(int(labels.sum()))
    return add_marker(pixels, torch.randint(0, 10, labels.shape, generator=g))


PERTURB = {"marker": _marker_only, "digit": _digit_only}


class _Build:
    def __init__(self, reader: str) -> None:
        self.reader = reader

    def __call__(self, path: Path) -> dict[str, Any]:
        from stitchsim_worker.engine.models.zoo import make_checkpoint

        s = dict(SETTINGS)
        acc = make_checkpoint(path, s.pop("arch"), s.pop("dataset"),
                              perturb=PERTURB[self.reader], **s)
        return {"test_accuracy": acc}


def reader_model(reader: str, dest: Path) -> Path:
    """The `reader` model ("marker" or "digit") as a checkpoint file at dest."""
    cached_model(f"probe_{reader}_reader", {**SETTINGS, "reader": reader},
                 [*TRAINING_CODE, "tests/engine/probe_models.py"], _Build(reader), dest)
    return dest
