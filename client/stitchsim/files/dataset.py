"""The dataset schema: the one validator of an uploaded image-classification file, run by the
client before an upload, by the gateway on upload and by the engine before it loads one.

A dataset file is a safetensors file that holds exactly these four tensors:

    train_images, test_images   N x C x H x W, C = 1 or 3, 1 <= H, W <= 1024, uint8 (0-255)
                                or float (F16/BF16/F32/F64, values in [0, 1]); both splits
                                the same C x H x W and dtype
    train_labels, test_labels   1-D integer (int64, int32, int16 or uint8), one label per
                                image, values in 0 .. 9999

and each split has at least 10 samples. Where the client and the engine used to disagree, the
rules are: extra tensors are refused, not ignored (a name misspelt or a payload riding along
is a mistake to point out, and everything stored counts against a quota); labels may be any of
the four integer dtypes torch reads, not only int64 (numpy's default integer is int32 on some
platforms, and class ids fit in uint8); fewer than 10 samples in a split are refused on upload
already, not only when a job starts. What needs the pixel values (floats within [0, 1], no
NaN) is checked by the engine, which reads them anyway.
"""

from __future__ import annotations

import sys
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from stitchsim.files.errors import InvalidDataset
from stitchsim.files.header import Header, TensorInfo, read_header
from stitchsim.files.limits import (
    DEFAULT_MAX_HEADER_BYTES,
    IMAGE_DTYPES,
    LABEL_DTYPES,
    MAX_CLASSES,
    MAX_IMAGE_SIDE,
    MIN_SAMPLES,
)

DATASET_TENSORS = ("train_images", "train_labels", "test_images", "test_labels")
_LABEL_TYPECODES = {"U8": "B", "I16": "h", "I32": "i", "I64": "q"}
_LABEL_NAMES = "int64, int32, int16 or uint8"


@dataclass(frozen=True)
class DatasetFileInfo:
    n_train: int
    n_test: int
    image_shape: tuple[int, int, int]
    image_dtype: str
    n_classes: int


def read_labels(source: str | Path | BinaryIO, tensor: TensorInfo) -> list[int]:
    """The values of a 1-D integer label tensor."""
    if tensor.dtype not in _LABEL_TYPECODES or len(tensor.shape) != 1:
        raise InvalidDataset(f"{tensor.name} must be a 1-D integer tensor ({_LABEL_NAMES})")
    if isinstance(source, (str, Path)):
        with open(source, "rb") as fh:
            return read_labels(fh, tensor)
    source.seek(tensor.start)
    raw = source.read(tensor.end - tensor.start)
    if len(raw) != tensor.end - tensor.start:
        raise InvalidDataset(f"{tensor.name} is truncated")
    values = array(_LABEL_TYPECODES[tensor.dtype])
    values.frombytes(raw)
    if sys.byteorder != "little":
        values.byteswap()
    return values.tolist()


def _check_names(header: Header) -> None:
    names = set(header.tensors)
    missing = [n for n in DATASET_TENSORS if n not in names]
    extra = sorted(names - set(DATASET_TENSORS))
    if missing or extra:
        parts = []
        if missing:
            parts.append("it lacks " + ", ".join(missing))
        if extra:
            parts.append("it also holds " + ", ".join(extra[:10]))
        raise InvalidDataset(
            "a dataset file holds exactly train_images, train_labels, test_images and "
            "test_labels: " + "; ".join(parts),
            details={"missing": missing, "unexpected": extra},
        )


def _check_split(header: Header, split: str) -> tuple[int, tuple[int, int, int], str]:
    """(samples, C x H x W, image dtype) of one split."""
    images = header.tensors[f"{split}_images"]
    labels = header.tensors[f"{split}_labels"]
    if images.dtype not in IMAGE_DTYPES:
        raise InvalidDataset(
            f"{split}_images has dtype {images.dtype}; use uint8 (0-255) or float (0-1)"
        )
    if len(images.shape) != 4:
        raise InvalidDataset(
            f"{split}_images has shape {list(images.shape)}; expected N x C x H x W"
        )
    n, c, h, w = images.shape
    if c not in (1, 3):
        raise InvalidDataset(
            f"{split}_images has {c} channels; expected N x C x H x W with C = 1 or 3 "
            "(channels first)"
        )
    if not (1 <= h <= MAX_IMAGE_SIDE and 1 <= w <= MAX_IMAGE_SIDE):
        raise InvalidDataset(f"{split}_images are {h}x{w}; sides must lie in 1..{MAX_IMAGE_SIDE}")
    if labels.dtype not in LABEL_DTYPES or len(labels.shape) != 1:
        raise InvalidDataset(
            f"{split}_labels must be a 1-D integer tensor ({_LABEL_NAMES}), got {labels.dtype} "
            f"of shape {list(labels.shape)}"
        )
    if labels.shape[0] != n:
        raise InvalidDataset(f"{split}_labels has {labels.shape[0]} labels for {n} images")
    if n < MIN_SAMPLES:
        raise InvalidDataset(
            f"{split}_images holds {n} images; a dataset needs at least {MIN_SAMPLES} train "
            f"and {MIN_SAMPLES} test samples"
        )
    return n, (c, h, w), images.dtype


def check_dataset(
    source: str | Path | BinaryIO,
    header: Header | None = None,
    *,
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
) -> DatasetFileInfo:
    """Check that a safetensors file holds a usable image-classification dataset (the rules
    are in this module's docstring); raises InvalidDataset (or SafetensorsError for a file
    that is no valid safetensors file at all)."""
    if header is None:
        header = read_header(source, max_header_bytes=max_header_bytes)
    _check_names(header)
    (n_train, shape, dtype), (n_test, test_shape, test_dtype) = (
        _check_split(header, "train"), _check_split(header, "test"))
    if shape != test_shape:
        raise InvalidDataset(
            f"train images are {list(shape)} but test images are {list(test_shape)}; both "
            "splits need the same C x H x W"
        )
    if dtype != test_dtype:
        raise InvalidDataset("train_images and test_images must have the same dtype")
    top = -1
    for split in ("train", "test"):
        labels = read_labels(source, header.tensors[f"{split}_labels"])
        low, high = min(labels), max(labels)
        if low < 0 or high >= MAX_CLASSES:
            raise InvalidDataset(
                f"{split}_labels must lie in 0..{MAX_CLASSES - 1}, found {low}..{high}"
            )
        top = max(top, high)
    return DatasetFileInfo(n_train=n_train, n_test=n_test, image_shape=shape, image_dtype=dtype,
                           n_classes=top + 1)
