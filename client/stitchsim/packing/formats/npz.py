"""NumPy .npz: named arrays of images and labels, loaded with allow_pickle=False after the zip
passed the archive checks and every member's header was read and found to declare exactly the
data it holds (an object array, which needs a pickle, is refused there).

Accepted names, first match wins (labels unless unlabelled; the test pair is optional, the
test split is made from train without it):

    x_train, y_train, x_test, y_test              (Keras' datasets)
    train_images, train_labels, test_images, test_labels
    images, labels                                (one split)
    x, y                                          (one split)

Images are N x H x W, N x H x W x C or N x C x H x W (C = 1 or 3; a fourth channel is
dropped), uint8 or floats in [0, 1]; labels 1-D integers (N x 1 and one-hot rows are read
too). The arrays are held in memory while packing (npz members cannot be memory-mapped).
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import numpy as np

from stitchsim.errors import DatasetSourceError
from stitchsim.packing.archives import ZipTree
from stitchsim.packing.formats.arrays import images_hwc, labels_1d
from stitchsim.packing.options import PackOptions
from stitchsim.packing.records import Found, Record, Stream

NAME = "npz"
SCHEMES = (
    ("x_train", "y_train", "x_test", "y_test"),
    ("train_images", "train_labels", "test_images", "test_labels"),
    ("images", "labels", None, None),
    ("x", "y", None, None),
)


def accepted_names() -> str:
    return "; ".join("/".join(n for n in scheme if n) for scheme in SCHEMES)


def _declared(path: Path, name: str, fh: IO[bytes]) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype a .npy member's header declares (numpy's own header parser)."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(fh)
        shape, _, dtype = (fmt.read_array_header_1_0(fh) if version == (1, 0)
                           else fmt.read_array_header_2_0(fh))
    except ValueError as exc:
        raise DatasetSourceError(f"{path}: member {name} is not a valid .npy array ({exc})"
                                 ) from None
    return tuple(shape), dtype


def _is_array(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> bool:
    """Whether numpy reads the member as an array: by its content, not its name (np.load
    lists `x_train` without .npy as an array too, when it starts with the .npy magic)."""
    if info.filename.endswith(".npy"):
        return True
    with zf.open(info) as fh:
        return fh.read(len(np.lib.format.MAGIC_PREFIX)) == np.lib.format.MAGIC_PREFIX


def check_members(path: Path) -> None:
    """Refuse, before numpy allocates anything, a member whose header declares more (or less)
    data than it holds, or an object array (which only a pickle can read): a crafted header
    declaring 100 GB over 1 KB of data otherwise asks numpy for the 100 GB."""
    tree = ZipTree(path)
    tree.files()  # paths, links and bombs checked before a member is opened
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if info.is_dir() or not _is_array(zf, info):
                    continue
                name = info.filename.removesuffix(".npy")
                with zf.open(info) as fh:
                    shape, dtype = _declared(path, name, fh)
                    header = fh.tell()
                if dtype.hasobject:
                    raise DatasetSourceError(
                        f"{path}: array {name} holds Python objects ({dtype}), which only a "
                        "pickle can read and this client never runs; save plain numeric arrays")
                declared = math.prod(shape) * dtype.itemsize
                held = info.file_size - header
                if declared != held:
                    raise DatasetSourceError(
                        f"{path}: array {name} declares shape {list(shape)} of {dtype} "
                        f"({declared:,} bytes) but holds {held:,} bytes of data; the file is "
                        "corrupt or was made by hand (save it again with numpy.savez)")
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise DatasetSourceError(f"{path}: not a readable .npz file ({exc})") from None


def read(path: Path, options: PackOptions) -> Found:
    check_members(path)
    try:
        npz = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise DatasetSourceError(f"{path}: not a readable .npz file ({exc})") from None
    with npz:
        names = set(npz.files)
        scheme = next((s for s in SCHEMES if s[0] in names), None)
        if scheme is None:
            raise DatasetSourceError(
                f"{path}: holds arrays {', '.join(sorted(names)) or '(none)'}; the accepted "
                f"names are {accepted_names()}")
        x_train, y_train, x_test, y_test = scheme
        notes: list[str] = []
        splits = {}
        for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
            if x is None or x not in names:
                continue
            images = _load(npz, path, x)
            images = images_hwc(path, x, images, notes)
            labels: list[int | None] = [None] * len(images)
            if not options.unlabelled:
                if y is None or y not in names:
                    raise DatasetSourceError(
                        f"{path}: {x} has no labels beside it ({y}); add them, or pack the "
                        "images without labels (--unlabelled)")
                labels = list(labels_1d(path, y, _load(npz, path, y), len(images), notes))
            splits[split] = Stream(f"{path}:{x}", _scanner(x, images, labels))
        unused = sorted(names - set(scheme))
        if unused:
            notes.append(f"arrays not read: {', '.join(unused)}")
    return Found(NAME, path, splits, labelled=not options.unlabelled, notes=notes)


def _load(npz: np.lib.npyio.NpzFile, path: Path, name: str) -> np.ndarray:
    # check_members vouched for the sizes; what can still fail is memory, or a member
    # that changed since.
    try:
        return np.asarray(npz[name])
    except MemoryError:
        raise DatasetSourceError(f"{path}: array {name} does not fit in this machine's memory; "
                                 "pack a smaller file") from None
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise DatasetSourceError(f"{path}: array {name} cannot be read ({exc})") from None


def _scanner(name: str, images: np.ndarray, labels: list[int | None]
             ) -> Callable[[], Iterator[Record]]:
    def scan() -> Iterator[Record]:
        for i in range(len(images)):
            yield Record(f"{name}[{i}]", labels[i], images[i])

    return scan
