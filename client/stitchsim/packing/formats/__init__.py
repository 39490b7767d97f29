"""One reader per dataset format of the catalogue (stitchsim.catalogue.DATASET_FORMATS), under
the same name, and telling the formats apart by a source's name and, for tars, its contents.

A reader is `read(path, options) -> Found`. Reader modules import numpy, Pillow or pyarrow, so
they are imported only once `deps.require` has found them (the `data` extra)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from stitchsim.catalogue import DATASET_FORMATS
from stitchsim.errors import DatasetSourceError
from stitchsim.packing.archives import TarTree
from stitchsim.packing.options import PackOptions
from stitchsim.packing.records import Found

Reader = Callable[[Path, PackOptions], Found]

MODULES = {name: f"stitchsim.packing.formats.{name}" for name in
           ("safetensors", "imagefolder", "parquet", "npz", "webdataset")}
"""Each catalogued format's reader module (its `read` and `NAME`)."""

_SNIFF_MEMBERS = 1000


def reader(name: str) -> Reader:
    module = importlib.import_module(MODULES[name])
    read: Reader = module.read
    return read


def detect(path: Path, given: str | None = None) -> str:
    """The format to read `path` as: `given`, else the one its name (or, for a tar, its first
    members) says."""
    if not path.exists():
        raise DatasetSourceError(f"{path}: no such file or folder")
    if given is not None:
        return given
    if path.is_dir():
        dirs = DATASET_FORMATS.where(directory=True)
        return dirs[0]
    name = path.name.lower()
    matches = [e.name for e in DATASET_FORMATS if name.endswith(e.suffixes)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        known = sorted({s for e in DATASET_FORMATS for s in e.suffixes})
        raise DatasetSourceError(
            f"{path}: cannot tell its dataset format from its name (known endings: "
            f"{', '.join(known)}, or a folder); name one with --format "
            f"({', '.join(DATASET_FORMATS.names)})")
    return _tar_kind(path, matches)


def _tar_kind(path: Path, matches: list[str]) -> str:
    """A tar is a WebDataset when its first samples pair an image with another file by key
    (a label, or a label file of a kind this client does not read: the reader then says so in
    WebDataset's terms), else an ImageFolder packed into a tar."""
    # Standard library and pydantic only: it may run before the data extra is checked.
    from stitchsim.packing.formats.webdataset import IMAGE_EXTS, split_key

    exts: dict[str, set[str]] = {}
    for rel in TarTree(path).first(_SNIFF_MEMBERS):
        parsed = split_key(rel)
        if parsed is not None:
            exts.setdefault(parsed[0], set()).add(parsed[1])
    paired = any(e & set(IMAGE_EXTS) and len(e) > 1 for e in exts.values())
    want = "webdataset" if paired else "imagefolder"
    return want if want in matches else matches[0]


def detected_as(path: Path, name: str) -> str:
    """What a refusal of an auto-detected source adds: the format it was read as, why, and
    how to name another, so a message in one format's terms is not taken for the only way."""
    if not (path.is_file() and name in ("webdataset", "imagefolder")
            and path.name.lower().endswith(TarTree.SUFFIXES)):
        return ""
    why = ("its members pair each image with other files by key" if name == "webdataset"
           else "no image in it shares its key with another file, as WebDataset samples do")
    other = "imagefolder" if name == "webdataset" else "webdataset"
    return (f" (read as a{'' if name == 'webdataset' else 'n'} {DATASET_FORMATS.label(name)}: "
            f"{why}; if it is not one, name its format with --format {other})")
