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
        ({"train_images": torch.zeros(20, 3, 8, 8, dtype=torch.uint8)}, "lacks test_images"),
        (
            {
                "train_images": torch.zeros(20, 3, 8, 8, dtype=torch.uint8),
                "train_labels": torch.zeros(20, dtype=torch.int64),
                "test_images": torch.zeros(20, 3, 8, 8, dtype=torch.uint8),
            },
            "lacks test_labels",
        ),
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


def _packed_file(path: Path, labelled: bool = True, **metadata: str) -> torch.Tensor:
    """A grey uint8 file as `stitchsim dataset pack` writes one; returns its train images."""
    g = torch.Generator().manual_seed(0)
    train = torch.randint(0, 256, (40, 1, 6, 6), dtype=torch.uint8, generator=g)
    tensors = {"train_images": train,
               "test_images": torch.randint(0, 256, (20, 1, 6, 6), dtype=torch.uint8,
                                            generator=g)}
    if labelled:
        tensors |= {"train_labels": torch.arange(40) % 4, "test_labels": torch.arange(20) % 4}
    save_file(tensors, str(path), metadata=metadata or None)
    return train


def test_uploaded_uint8_files_are_memory_mapped_and_read_per_batch(tmp_path: Path) -> None:
    path = tmp_path / "packed.safetensors"
    train = _packed_file(path, test_split='{"made": true, "fraction": 0.25, "seed": 0, '
                         '"stratified": true}', source_format="imagefolder")
    ds = load_dataset(LocalPath(path=str(path)), Resources(cache_dir=tmp_path),
                      TrainSettings(max_train_samples=16))
    pixels = ds.train.pixels
    # Mapped from the file, as far as the job reads: nothing is loaded as float32.
    assert pixels.on_disk and pixels.stored_bytes == 16 * 36 and len(pixels) == 16
    batch = pixels[torch.tensor([1, 7])]
    assert batch.dtype == torch.float32 and batch.shape == (2, 3, 6, 6)  # grey to RGB
    assert torch.equal(batch[:, 0], train[[1, 7], 0].float() / 255)
    assert torch.equal(batch[:, 2], batch[:, 0])
    assert torch.equal(pixels[slice(0, 16)], ds.train.images)
    described = ds.describe()
    assert described["test_split"] == ("made from the training split when packed: 25% of it, "
                                       "stratified by class, seed 0")
    assert described["image_shape"] == [3, 6, 6] and described["stored_dtype"] == "uint8"
    assert described["labelled"] is True and described["source_format"] == "imagefolder"


def test_an_unlabelled_dataset_is_refused_where_labels_are_needed(tmp_path: Path) -> None:
    from stitchsim.models import Spec
    from stitchsim_worker.engine.job.prepare import check_labels, labels_needed

    path = tmp_path / "unlabelled.safetensors"
    _packed_file(path, labelled=False)
    ds = load_dataset(LocalPath(path=str(path)), Resources(cache_dir=tmp_path), TrainSettings())
    assert not ds.labelled and ds.describe()["labelled"] is False
    assert bool((ds.train.labels == -1).all())
    spec = Spec.model_validate({"front": {"checkpoint": "a"}, "back": {"checkpoint": "b"},
                                "objectives": ["hlm", "slm"], "controls": ["clustered_noise"]})
    needs = labels_needed(spec)
    # The controls fall back on pseudo-classes (k-means of the back model's outputs).
    assert needs[1:] == ["objective hlm"]
    assert needs[0].startswith("logits outputs")  # every figure of a classifier, today
    with pytest.raises(Failure, match="has no labels, and this job needs them for: logits") as e:
        check_labels(spec, ds)
    assert e.value.code == "labels_needed"
    check_labels(spec, builtin("digits"), None)  # labelled data pass
