"""Built-in datasets and the uploaded dataset format."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from stitchsim.failure import Failure
from stitchsim.models import BUILTIN_DATASETS, LocalPath, TrainSettings
from stitchsim_worker.engine import Resources
from stitchsim_worker.engine.data.datasets import (
    CLASS_COLOURS,
    builtin,
    load_dataset,
    save_dataset_file,
)


def _colour_class(images: torch.Tensor) -> torch.Tensor:
    """The class whose colour is nearest to each image's brightest pixel colour."""
    flat = images.flatten(2)
    brightest = flat.gather(2, flat.sum(1, keepdim=True).argmax(2, keepdim=True).expand(-1, 3, 1))[
        ..., 0
    ]
    return torch.cdist(brightest, CLASS_COLOURS).argmin(1)


def test_builtins_are_rgb_unit_range_and_stratified() -> None:
    for name in BUILTIN_DATASETS:
        ds = builtin(name)
        assert ds.train.images.shape[1:] == (3, 32, 32), name
        assert float(ds.train.images.min()) >= 0 and float(ds.train.images.max()) <= 1
        assert len(ds.train) + len(ds.test) == (2000 if name == "shapes" else 1797), name
        counts = torch.bincount(ds.test.labels, minlength=10)
        assert int(counts.min()) >= 30  # every class in the test split
    assert torch.equal(builtin("digits").train.images, builtin("digits").train.images)


def test_colour_variants_carry_the_intended_cues() -> None:
    correlated, colour_only, digit_only = (
        builtin(n) for n in ("digits_correlated", "digits_colour_only", "digits_digit_only")
    )
    assert (_colour_class(correlated.test.images) == correlated.test.labels).float().mean() > 0.95
    assert (_colour_class(colour_only.test.images) == colour_only.test.labels).float().mean() > 0.95
    assert (_colour_class(digit_only.test.images) == digit_only.test.labels).float().mean() < 0.3
    marker = builtin("digits_marker")
    corner = marker.test.images[:, :, 0, 0]
    assert torch.allclose(corner, CLASS_COLOURS[marker.test.labels])


def test_uploaded_files_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "digits.safetensors"
    save_dataset_file(path, builtin("digits"))
    ds = load_dataset(
        LocalPath(path=str(path)),
        Resources(cache_dir=tmp_path),
        TrainSettings(max_train_samples=100),
    )
    assert len(ds.train) == 100 and len(ds.test) == 359
    assert ds.n_classes == 10
    assert torch.allclose(ds.test.images, builtin("digits").test.images, atol=1 / 255)


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ({"train_images": torch.zeros(20, 3, 8, 8, dtype=torch.uint8)}, "lacks train_labels"),
        (
            {
                "train_images": torch.zeros(20, 2, 8, 8),
                "train_labels": torch.zeros(20, dtype=torch.int64),
                "test_images": torch.zeros(20, 2, 8, 8),
                "test_labels": torch.zeros(20, dtype=torch.int64),
            },
            "C = 1 or 3",
        ),
        (
            {
                "train_images": torch.full((20, 3, 8, 8), 2.0),
                "train_labels": torch.zeros(20, dtype=torch.int64),
                "test_images": torch.zeros(20, 3, 8, 8),
                "test_labels": torch.zeros(20, dtype=torch.int64),
            },
            "must lie in \\[0, 1\\]",
        ),
        (
            {
                "train_images": torch.zeros(20, 3, 8, 8),
                "train_labels": torch.zeros(19, dtype=torch.int64),
                "test_images": torch.zeros(20, 3, 8, 8),
                "test_labels": torch.zeros(20, dtype=torch.int64),
            },
            "19 labels for 20 images",
        ),
        (
            {
                "train_images": torch.zeros(20, 3, 8, 8),
                "train_labels": torch.zeros(20, dtype=torch.float32),
                "test_images": torch.zeros(20, 3, 8, 8),
                "test_labels": torch.zeros(20, dtype=torch.int64),
            },
            "integer tensor",
        ),
    ],
)
def test_bad_dataset_files_say_what_to_fix(tmp_path: Path, tensors: dict, message: str) -> None:
    path = tmp_path / "bad.safetensors"
    save_file(tensors, str(path))
    with pytest.raises(Failure, match=message):
        load_dataset(LocalPath(path=str(path)), Resources(cache_dir=tmp_path), TrainSettings())


def test_unknown_builtin_lists_the_valid_names(tmp_path: Path) -> None:
    with pytest.raises(Failure, match="digits_marker"):
        load_dataset("mnist", Resources(cache_dir=tmp_path), TrainSettings())
