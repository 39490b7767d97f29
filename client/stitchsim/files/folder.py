"""A model folder as people save them, made into the one safetensors file the service stores.

`transformers`' `save_pretrained` and timm's hub layout write `config.json` beside
`model.safetensors` (or beside shards listed in `model.safetensors.index.json`); HF adds a
`preprocessor_config.json`. The upload is one file: every tensor of every shard, and the config
files' text in `__metadata__` under their own names. One file is stored whole or not at all, so
half a folder never leaves anything behind; and the same folder always packs to the same bytes
(sorted tensors, the config as read), so it is stored once however often it is uploaded.

Standard library only: tensor bytes are copied as they are, never decoded.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from stitchsim.files.errors import SafetensorsError
from stitchsim.files.header import Header, read_header
from stitchsim.files.links import LinkOutside, boundary, check_inside
from stitchsim.files.model_config import (
    CONFIG_FILE,
    MAX_CONFIG_BYTES,
    PROCESSOR_FILE,
    ModelConfig,
    from_metadata,
)

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_PICKLED = ("pytorch_model.bin", "pytorch_model.bin.index.json", "open_clip_pytorch_model.bin")


class InvalidModelFolder(SafetensorsError):
    """A folder that lacks what its layout needs; the message names the file to add."""

    code = "invalid_model_folder"


def is_model_folder(path: str | os.PathLike[str]) -> bool:
    return Path(path).is_dir()


@dataclass(frozen=True)
class PackedModel:
    path: Path
    config: ModelConfig
    shards: int
    tensors: int


def _read_text(path: Path, cap: int) -> str:
    size = path.stat().st_size
    if size > cap:
        raise InvalidModelFolder(
            f"{path.name} is {size:,} bytes, more than the {cap:,} accepted; remove large "
            "fields from it", details={"file": path.name, "size": size, "limit": cap})
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InvalidModelFolder(f"{path.name} is not UTF-8 text (JSON only)",
                                 details={"file": path.name}) from None


def _shards(folder: Path) -> list[Path]:
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(_read_text(index, 16 * MAX_CONFIG_BYTES))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise InvalidModelFolder(f"{INDEX_FILE} must be JSON with a 'weight_map' object "
                                     "of tensor name -> shard file",
                                     details={"file": INDEX_FILE}) from None
        shards = []
        for name in names:
            if not isinstance(name, str) or "/" in name or "\\" in name or name.startswith("."):
                raise InvalidModelFolder(f"{INDEX_FILE}: shard {name!r} is not a file name in "
                                         "the folder", details={"file": INDEX_FILE})
            shard = folder / name
            if not shard.is_file():
                raise InvalidModelFolder(
                    f"{INDEX_FILE} lists {name}, which is not in {folder}: the folder is "
                    "incomplete; copy every shard the index lists", details={"file": name})
            shards.append(shard)
        return shards
    if (folder / WEIGHTS_FILE).is_file():
        return [folder / WEIGHTS_FILE]
    pickled = [n for n in _PICKLED if (folder / n).is_file()]
    hint = (f"; it holds {pickled[0]}, a pickle this service never loads: save with "
            "safe_serialization=True (save_pretrained's default)") if pickled else ""
    raise InvalidModelFolder(f"{folder} has neither {WEIGHTS_FILE} nor {INDEX_FILE}{hint}",
                             details={"file": WEIGHTS_FILE})


def _check_index(folder: Path, headers: list[tuple[Path, Header]]) -> None:
    index = folder / INDEX_FILE
    if not index.is_file():
        return
    weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    for path, header in headers:
        wrong = [t for t in header.tensors if weight_map.get(t) != path.name]
        if wrong:
            raise InvalidModelFolder(
                f"{path.name} holds {wrong[0]!r}, which {INDEX_FILE} places elsewhere; the "
                "shards and the index come from different saves", details={"file": path.name})
    found = {t for _, h in headers for t in h.tensors}
    missing = sorted(set(weight_map) - found)
    if missing:
        raise InvalidModelFolder(
            f"{INDEX_FILE} lists {len(missing)} tensors no shard holds (first: {missing[:3]}); "
            "the folder is incomplete", details={"file": INDEX_FILE})


def _refuse_links_outside(folder: Path, paths: list[Path]) -> None:
    """Every file the upload is made of stays inside the folder (or its HF cache repo)."""
    within = boundary(folder)
    for path in paths:
        try:
            check_inside(path, folder, within=within)
        except LinkOutside as exc:
            raise InvalidModelFolder(str(exc), details={"file": path.name}) from None


def read_folder(folder: Path) -> tuple[dict[str, str], list[tuple[Path, Header]]]:
    """The folder's config texts and its shards' validated headers; nothing is written."""
    _refuse_links_outside(folder, [folder / n for n in (CONFIG_FILE, PROCESSOR_FILE, INDEX_FILE)])
    if not (folder / CONFIG_FILE).is_file():
        raise InvalidModelFolder(
            f"{folder} has no {CONFIG_FILE}: a model folder is what save_pretrained "
            "(transformers) or save_for_hf (timm) writes; or upload the .safetensors file "
            "alone and name its architecture (--arch)", details={"file": CONFIG_FILE})
    texts = {name: _read_text(folder / name, MAX_CONFIG_BYTES)
             for name in (CONFIG_FILE, PROCESSOR_FILE) if (folder / name).is_file()}
    shards = _shards(folder)
    _refuse_links_outside(folder, shards)
    headers = []
    for shard in shards:
        try:
            headers.append((shard, read_header(shard)))
        except SafetensorsError as e:
            raise type(e)(f"{shard.name}: {e.message}", details=e.details) from None
    _check_index(folder, headers)
    return texts, headers


def _metadata(texts: dict[str, str], headers: list[tuple[Path, Header]]) -> dict[str, str]:
    meta: dict[str, str] = {}
    for _, header in headers:  # the shards' own (format: pt ...), the first one's winning
        meta = {**header.metadata, **meta}
    meta.update(texts)
    config = from_metadata(meta)
    assert config is not None
    meta.setdefault("arch", config.arch)
    if config.arch_kwargs:
        meta.setdefault("arch_kwargs", json.dumps(config.arch_kwargs, sort_keys=True))
    return meta


def pack_model_folder(folder: str | os.PathLike[str], out: str | os.PathLike[str]
                      ) -> PackedModel:
    """Write the folder as one safetensors file at `out`; raises InvalidModelFolder or
    InvalidModelConfig (what to fix, naming the file) before anything is written."""
    folder, out = Path(folder), Path(out)
    texts, headers = read_folder(folder)
    meta = _metadata(texts, headers)
    seen: dict[str, Path] = {}
    entries: list[tuple[str, Path, Header]] = []
    for path, header in headers:
        for name in header.tensors:
            if name in seen:
                raise InvalidModelFolder(f"{name!r} is in both {seen[name].name} and "
                                         f"{path.name}", details={"file": path.name})
            seen[name] = path
            entries.append((name, path, header))
    entries.sort(key=lambda e: e[0])
    table: dict[str, object] = {"__metadata__": meta}
    pos = 0
    for name, _, header in entries:
        t = header.tensors[name]
        table[name] = {"dtype": t.dtype, "shape": list(t.shape),
                       "data_offsets": [pos, pos + t.end - t.start]}
        pos += t.end - t.start
    raw = json.dumps(table, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # tensor data starts 8-byte aligned, as safetensors writes
    partial = out.with_name(out.name + ".partial")
    with contextlib.ExitStack() as stack:
        dst = stack.enter_context(partial.open("wb"))
        sources = {path: stack.enter_context(path.open("rb")) for path, _ in headers}
        dst.write(struct.pack("<Q", len(raw)) + raw)
        for name, path, header in entries:
            t = header.tensors[name]
            sources[path].seek(t.start)
            _copy(sources[path], dst, t.end - t.start)
    os.replace(partial, out)
    config = from_metadata(meta)
    assert config is not None
    return PackedModel(out, config, len(headers), len(entries))


def _copy(src, dst, n: int) -> None:  # type: ignore[no-untyped-def]
    while n > 0:
        block = src.read(min(n, 1 << 20))
        if not block:
            raise InvalidModelFolder("a shard changed while it was read")
        dst.write(block)
        n -= len(block)


__all__ = ["InvalidModelFolder", "PackedModel", "is_model_folder", "pack_model_folder",
           "read_folder"]
