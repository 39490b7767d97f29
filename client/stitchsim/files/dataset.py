"""The dataset schema: the one validator of an uploaded image-classification file, run by the
client before an upload, by the gateway on upload and by the engine before it loads one.

A dataset file is a safetensors file that holds these tensors:

    train_images, test_images   N x C x H x W, C = 1 or 3, 1 <= H, W <= 1024, uint8 (0-255)
                                or float (F16/BF16/F32/F64, values in [0, 1]); both splits
                                the same C x H x W and dtype
    train_labels, test_labels   1-D integer (int64, int32, int16 or uint8), one label per
                                image, values in 0 .. 9999; both, or neither (an unlabelled
                                dataset: stored, but a job refuses it where a figure needs
                                labels)

and each split has at least 10 samples. `stitchsim dataset pack` writes uint8 images (what the
workers memory-map) and int64 labels, and records in `__metadata__` what it did:

    classes         JSON list of class names, index = label (at least as many as labels)
    test_split      JSON object: {"made": false} when the source gave a test split, else
                    {"made": true, "fraction": f, "seed": s, "stratified": bool}
    source_format   the reader it was packed from (a catalogue name: imagefolder, parquet ...)
    notes           JSON list of what the packing changed (resized images, grey to RGB ...)

Each is optional (hand-made files carry none), and checked when present, so a report never
repeats a malformed claim. Where the client and the engine used to disagree, the rules are:
extra tensors are refused, not ignored (a name misspelt or a payload riding along is a mistake
to point out, and everything stored counts against a quota); labels may be any of the four
integer dtypes torch reads, not only int64 (numpy's default integer is int32 on some
platforms, and class ids fit in uint8); fewer than 10 samples in a split are refused on upload
already, not only when a job starts. What needs the pixel values (floats within [0, 1], no
NaN) is checked by the engine, which reads them anyway.
"""

from __future__ import annotations

import json
import sys
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from stitchsim.files.errors import InvalidDataset, show
from stitchsim.files.header import Header, TensorInfo, read_header
from stitchsim.files.limits import (
    DEFAULT_MAX_HEADER_BYTES,
    IMAGE_DTYPES,
    LABEL_DTYPES,
    MAX_CLASSES,
    MAX_IMAGE_SIDE,
    MIN_SAMPLES,
)
from stitchsim.jsondepth import JSONInputError, parse_json

IMAGE_TENSORS = ("train_images", "test_images")
LABEL_TENSORS = ("train_labels", "test_labels")
DATASET_TENSORS = ("train_images", "train_labels", "test_images", "test_labels")
_LABEL_TYPECODES = {"U8": "B", "I16": "h", "I32": "i", "I64": "q"}
_LABEL_NAMES = "int64, int32, int16 or uint8"

META_CLASSES = "classes"
META_TEST_SPLIT = "test_split"
META_SOURCE_FORMAT = "source_format"
META_NOTES = "notes"


@dataclass(frozen=True)
class TestSplit:
    """How the test split came to be: given by the source, or made from its training split."""

    __test__ = False  # not a pytest class, whatever its name

    made: bool
    fraction: float | None = None
    seed: int | None = None
    stratified: bool = False

    def describe(self) -> str:
        if not self.made:
            return "given by the source"
        how = "stratified by class" if self.stratified else "random"
        return (f"made from the training split when packed: {self.fraction:.0%} of it, {how}, "
                f"seed {self.seed}")

    def as_metadata(self) -> str:
        if not self.made:
            return json.dumps({"made": False})
        return json.dumps({"made": True, "fraction": self.fraction, "seed": self.seed,
                           "stratified": self.stratified}, sort_keys=True)


@dataclass(frozen=True)
class DatasetFileInfo:
    n_train: int
    n_test: int
    image_shape: tuple[int, int, int]
    image_dtype: str
    n_classes: int | None
    """None for an unlabelled dataset."""
    classes: tuple[str, ...] | None = None
    test_split: TestSplit | None = None
    source_format: str | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def labelled(self) -> bool:
        return self.n_classes is not None


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


def _check_names(header: Header) -> bool:
    """Whether the file is labelled; refuses missing, half-present or extra tensors."""
    names = set(header.tensors)
    labels = [n for n in LABEL_TENSORS if n in names]
    missing = [n for n in IMAGE_TENSORS if n not in names]
    if len(labels) == 1:
        missing += [n for n in LABEL_TENSORS if n not in names]
    extra = sorted(names - set(DATASET_TENSORS))
    if missing or extra:
        parts = []
        if missing:
            parts.append("it lacks " + ", ".join(missing))
        if extra:
            parts.append("it also holds " + ", ".join(extra[:10]))
        raise InvalidDataset(
            "a dataset file holds train_images, test_images, train_labels and test_labels "
            "(both label tensors, or neither for unlabelled data) and nothing else: "
            + "; ".join(parts),
            details={"missing": missing, "unexpected": extra},
        )
    return bool(labels)


def _check_split(header: Header, split: str, labelled: bool
                 ) -> tuple[int, tuple[int, int, int], str]:
    """(samples, C x H x W, image dtype) of one split."""
    images = header.tensors[f"{split}_images"]
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
    if labelled:
        labels = header.tensors[f"{split}_labels"]
        if labels.dtype not in LABEL_DTYPES or len(labels.shape) != 1:
            raise InvalidDataset(
                f"{split}_labels must be a 1-D integer tensor ({_LABEL_NAMES}), got "
                f"{labels.dtype} of shape {list(labels.shape)}"
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
    labelled = _check_names(header)
    (n_train, shape, dtype), (n_test, test_shape, test_dtype) = (
        _check_split(header, "train", labelled), _check_split(header, "test", labelled))
    if shape != test_shape:
        raise InvalidDataset(
            f"train images are {list(shape)} but test images are {list(test_shape)}; both "
            "splits need the same C x H x W"
        )
    if dtype != test_dtype:
        raise InvalidDataset("train_images and test_images must have the same dtype")
    n_classes = None
    if labelled:
        top = -1
        for split in ("train", "test"):
            labels = read_labels(source, header.tensors[f"{split}_labels"])
            low, high = min(labels), max(labels)
            if low < 0 or high >= MAX_CLASSES:
                raise InvalidDataset(
                    f"{split}_labels must lie in 0..{MAX_CLASSES - 1}, found {low}..{high}"
                )
            top = max(top, high)
        n_classes = top + 1
    meta = header.metadata
    classes = _classes(meta.get(META_CLASSES), n_classes)
    return DatasetFileInfo(
        n_train=n_train, n_test=n_test, image_shape=shape, image_dtype=dtype,
        n_classes=n_classes, classes=classes, test_split=_test_split(meta.get(META_TEST_SPLIT)),
        source_format=meta.get(META_SOURCE_FORMAT), notes=_notes(meta.get(META_NOTES)))


# ---------------------------------------------------------------- metadata


def _json(key: str, raw: str) -> Any:
    try:
        return parse_json(raw, f"__metadata__[{key!r}]")
    except JSONInputError as exc:
        raise InvalidDataset(str(exc)) from None


def _classes(raw: str | None, n_classes: int | None) -> tuple[str, ...] | None:
    if raw is None:
        return None
    names = _json(META_CLASSES, raw)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise InvalidDataset(f"__metadata__[{META_CLASSES!r}] must be a JSON list of class "
                             f"names, got {show(names)}")
    if n_classes is None:
        raise InvalidDataset(f"__metadata__[{META_CLASSES!r}] names classes, but the file "
                             "holds no labels")
    if len(names) < n_classes:
        raise InvalidDataset(f"__metadata__[{META_CLASSES!r}] names {len(names)} classes, but "
                             f"the labels go up to {n_classes - 1}")
    if len(names) > MAX_CLASSES:
        raise InvalidDataset(f"__metadata__[{META_CLASSES!r}] names more than {MAX_CLASSES} "
                             "classes")
    return tuple(names)


def _test_split(raw: str | None) -> TestSplit | None:
    if raw is None:
        return None
    obj = _json(META_TEST_SPLIT, raw)
    bad = InvalidDataset(
        f"__metadata__[{META_TEST_SPLIT!r}] must be {{\"made\": false}} or {{\"made\": true, "
        f"\"fraction\": 0..1, \"seed\": integer, \"stratified\": true|false}}, got {show(obj)}")
    if not isinstance(obj, dict) or not isinstance(obj.get("made"), bool):
        raise bad
    if not obj["made"]:
        return TestSplit(made=False)
    fraction, seed, stratified = obj.get("fraction"), obj.get("seed"), obj.get("stratified")
    if (not isinstance(fraction, int | float) or isinstance(fraction, bool)
            or not 0 < fraction < 1 or not isinstance(seed, int) or isinstance(seed, bool)
            or not isinstance(stratified, bool)):
        raise bad
    return TestSplit(made=True, fraction=float(fraction), seed=seed, stratified=stratified)


def _notes(raw: str | None) -> tuple[str, ...]:
    if raw is None:
        return ()
    notes = _json(META_NOTES, raw)
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise InvalidDataset(f"__metadata__[{META_NOTES!r}] must be a JSON list of strings")
    return tuple(notes)
