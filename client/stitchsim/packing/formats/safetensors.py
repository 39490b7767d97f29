"""The service's own safetensors file as a source: checked by the one dataset validator,
then read through memory maps (nothing of it is loaded whole). Uploads send such a file as
it is; packing it again gives uint8 images (floats in [0, 1] scaled to 0..255) and a fresh
order, keeping its class names and how its test split was made."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from stitchsim.errors import DatasetSourceError
from stitchsim.files.dataset import check_dataset, read_labels
from stitchsim.files.errors import SafetensorsError
from stitchsim.files.header import TensorInfo, read_header
from stitchsim.packing.options import PackOptions
from stitchsim.packing.records import Found, Record, Stream

NAME = "safetensors"
_NUMPY = {"U8": np.uint8, "F16": np.float16, "F32": np.float32, "F64": np.float64,
          "BF16": np.uint16}


def mapped(path: Path, t: TensorInfo) -> np.ndarray:
    """The tensor's bytes in the file, as a read-only numpy memory map."""
    return np.memmap(path, dtype=np.dtype(_NUMPY[t.dtype]).newbyteorder("<"), mode="r",
                     offset=t.start, shape=t.shape)


def _hwc_uint8(path: Path, where: str, chw: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "U8":
        return np.asarray(chw).transpose(1, 2, 0)
    if dtype == "BF16":  # the upper half of a float32
        x = (np.asarray(chw).astype(np.uint32) << 16).view(np.float32)
    else:
        x = np.asarray(chw, dtype=np.float32)
    if not np.isfinite(x).all() or x.min() < 0 or x.max() > 1:
        raise DatasetSourceError(f"{path}: {where} holds values outside [0, 1] (or NaN); "
                                 "float images must lie in [0, 1]")
    return np.rint(x * 255).astype(np.uint8).transpose(1, 2, 0)


def read(path: Path, options: PackOptions) -> Found:
    try:
        header = read_header(path)
        info = check_dataset(path, header)
    except SafetensorsError as exc:
        raise DatasetSourceError(f"{path}: {exc.message}") from None
    splits = {}
    for split in ("train", "test"):
        images = header.tensors[f"{split}_images"]
        labels: list[int | None] = [None] * images.shape[0]
        if info.labelled and not options.unlabelled:
            labels = list(read_labels(path, header.tensors[f"{split}_labels"]))
        splits[split] = Stream(f"{path}:{split}", _scanner(path, split, images, labels))
    return Found(NAME, path, splits, labelled=info.labelled and not options.unlabelled,
                 class_names=list(info.classes) if info.classes else None,
                 notes=list(info.notes), test_split=info.test_split)


def _scanner(path: Path, split: str, t: TensorInfo, labels: list[int | None]
             ) -> Callable[[], Iterator[Record]]:
    def scan() -> Iterator[Record]:
        images = mapped(path, t)
        for i in range(len(labels)):
            where = f"{split}_images[{i}]"
            yield Record(where, labels[i], _hwc_uint8(path, where, images[i], t.dtype))

    return scan
