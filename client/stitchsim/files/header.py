"""The header of a safetensors file, validated strictly before any tensor is read.

The official loader is too lenient for files that come from strangers: it accepts duplicate
tensor names, headers that start with a space, a 100 MB header, and does not insist that the
data offsets tile the file.

A file is laid out as: 8 bytes little-endian u64 N, N bytes of UTF-8 JSON (right-padded with
spaces), then the tensor bytes; every tensor's ``data_offsets`` are relative to the byte just
after the header.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from stitchsim.files.errors import SafetensorsError, show
from stitchsim.files.limits import (
    DEFAULT_MAX_HEADER_BYTES,
    DTYPE_SIZES,
    MAX_METADATA_VALUE_CHARS,
    MAX_NAME_CHARS,
    MAX_RANK,
    MAX_TENSORS,
    MAX_U64,
    SNIFF_BYTES,
)
from stitchsim.files.model_config import from_metadata
from stitchsim.files.sniff import sniff
from stitchsim.jsondepth import MAX_JSON_DEPTH, nested_deeper_than


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    """Absolute offset of the first byte in the file."""
    end: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Header:
    header_size: int
    file_size: int
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def data_start(self) -> int:
        return 8 + self.header_size

    @property
    def n_tensors(self) -> int:
        return len(self.tensors)

    @property
    def arch(self) -> str | None:
        return self.metadata.get("arch")


def _reject_constant(name: str) -> Any:
    raise SafetensorsError(f"the header JSON contains {name}, which is not valid JSON")


def _pairs_no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise SafetensorsError(
                f"the header names {show(key)} twice; every tensor and metadata key must be "
                "unique"
            )
        out[key] = value
    return out


def header_length(first8: bytes, file_size: int, *, max_header_bytes: int) -> int:
    """The declared header size N, checked against the cap and the file size."""
    if file_size == 0:
        raise SafetensorsError("the file is empty")
    if file_size < 8 or len(first8) < 8:
        raise SafetensorsError(
            f"the file is {file_size} bytes long: too short to be safetensors (truncated?)"
        )
    (n,) = struct.unpack("<Q", first8[:8])
    if n < 2:
        raise SafetensorsError(
            f"the header length field says {n} bytes, less than the 2 of an empty JSON object"
        )
    if n > max_header_bytes:
        raise SafetensorsError(
            f"the header declares {n} bytes, more than the {max_header_bytes} bytes accepted "
            "(corrupt file, or not safetensors)",
            details={"header_size": n, "max_header_bytes": max_header_bytes},
        )
    if 8 + n > file_size:
        raise SafetensorsError(
            f"the header declares {n} bytes but the file has only {file_size - 8} after the "
            "length field: the file is truncated",
            details={"header_size": n, "file_size": file_size},
        )
    return n


def parse_header(
    head: bytes, file_size: int, *, max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
) -> Header:
    """Validate a header given the file's first 8 + N bytes (or more) and its total size."""
    sniff(head[:SNIFF_BYTES])
    n = header_length(head[:8], file_size, max_header_bytes=max_header_bytes)
    raw = head[8 : 8 + n]
    if len(raw) < n:
        raise SafetensorsError("the header is truncated")
    if raw[:1] != b"{":
        raise SafetensorsError(
            "the header must start with '{' (leading whitespace or other bytes are refused)"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SafetensorsError(f"the header is not valid UTF-8 (byte {exc.start})") from None
    stripped = text.rstrip(" ")
    if not stripped.endswith("}"):
        raise SafetensorsError(
            f"the {n} header bytes that the header length field declares do not hold one JSON "
            "object padded only with spaces (wrong header length, or other padding)"
        )
    try:
        obj = json.loads(
            stripped, object_pairs_hook=_pairs_no_duplicates, parse_constant=_reject_constant
        )
    except SafetensorsError:
        raise
    except (ValueError, RecursionError) as exc:
        raise SafetensorsError(f"the header is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise SafetensorsError("the header must be a JSON object")
    if "\\u" in stripped and _has_lone_surrogate(obj):
        raise SafetensorsError(
            "the header holds a \\u escape of a lone UTF-16 surrogate, which is not a character "
            "(readers of the file refuse it)"
        )

    metadata = _check_metadata(obj.pop("__metadata__", None))
    if len(obj) > MAX_TENSORS:
        raise SafetensorsError(f"the file holds {len(obj)} tensors, more than {MAX_TENSORS}")

    data_start = 8 + n
    data_len = file_size - data_start
    tensors: dict[str, TensorInfo] = {}
    for name, entry in obj.items():
        tensors[name] = _check_tensor(name, entry, data_start)

    # The tensors must tile the data region exactly: no gaps (hidden payloads), no overlaps
    # (aliasing), no trailing bytes, nothing missing (truncation).
    pos = 0
    for t in sorted(tensors.values(), key=lambda t: (t.start, t.end)):
        begin = t.start - data_start
        if begin != pos:
            what = "overlaps the previous tensor" if begin < pos else "leaves a gap before it"
            raise SafetensorsError(
                f"tensor {show(t.name)} starts at data offset {begin} but the previous tensor "
                f"ends at {pos}: it {what}",
                details={"tensor": t.name},
            )
        pos = t.end - data_start
    if pos != data_len:
        if pos > data_len:
            msg = (
                f"the tensors need {pos} data bytes but the file has {data_len}: "
                "the file is truncated"
            )
        else:
            msg = (
                f"the file has {data_len - pos} bytes after the last tensor; "
                "the offsets must cover the file exactly"
            )
        raise SafetensorsError(msg, details={"data_bytes": data_len, "covered": pos})
    return Header(header_size=n, file_size=file_size, tensors=tensors, metadata=metadata)


def _has_lone_surrogate(obj: Any) -> bool:
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _check_metadata(meta: Any) -> dict[str, str]:
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise SafetensorsError("__metadata__ must be a JSON object of strings")
    for key, value in meta.items():
        if not isinstance(value, str):
            raise SafetensorsError(
                f"__metadata__[{show(key)}] must be a string (JSON-encode structured values, e.g. "
                "arch_kwargs), got " + type(value).__name__
            )
        if len(value) > MAX_METADATA_VALUE_CHARS:
            raise SafetensorsError(f"__metadata__[{show(key)}] is too long")
    if "arch_kwargs" in meta:
        try:
            kwargs = json.loads(meta["arch_kwargs"], parse_constant=_reject_constant)
        except (ValueError, RecursionError):
            raise SafetensorsError("__metadata__['arch_kwargs'] must hold a JSON object") from None
        if not isinstance(kwargs, dict):
            raise SafetensorsError("__metadata__['arch_kwargs'] must hold a JSON object")
        if nested_deeper_than(kwargs, MAX_JSON_DEPTH):
            raise SafetensorsError(
                f"__metadata__['arch_kwargs'] is nested more than {MAX_JSON_DEPTH} levels deep"
            )
    from_metadata(meta)  # a packed folder's config.json: JSON, capped, no remote code
    return dict(meta)


def _check_tensor(name: str, entry: Any, data_start: int) -> TensorInfo:
    if not name or len(name) > MAX_NAME_CHARS:
        raise SafetensorsError("tensor names must be 1 to 1024 characters long")
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise SafetensorsError(
            f"tensor {show(name)} must be an object with exactly dtype, shape and data_offsets",
            details={"tensor": name},
        )
    dtype = entry["dtype"]
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise SafetensorsError(
            f"tensor {show(name)} has dtype {show(dtype)}; accepted: {', '.join(DTYPE_SIZES)}",
            details={"tensor": name, "dtype": show(dtype)},
        )
    shape = entry["shape"]
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_RANK
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise SafetensorsError(
            f"tensor {show(name)} has shape {show(shape)}; a shape is a list of at most "
            f"{MAX_RANK} non-negative integers",
            details={"tensor": name},
        )
    offsets = entry["data_offsets"]
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(
            isinstance(o, int) and not isinstance(o, bool) and 0 <= o <= MAX_U64 for o in offsets
        )
        or offsets[0] > offsets[1]
    ):
        raise SafetensorsError(
            f"tensor {show(name)} has data_offsets {show(offsets)}; expected [begin, end] with "
            "0 <= begin <= end < 2**64",
            details={"tensor": name},
        )
    nbytes = math.prod(shape) * DTYPE_SIZES[dtype]
    if nbytes > MAX_U64:
        raise SafetensorsError(
            f"tensor {show(name)} is {dtype} of shape {show(shape)}, whose size in bytes "
            "overflows 64 bits",
            details={"tensor": name},
        )
    if offsets[1] - offsets[0] != nbytes:
        raise SafetensorsError(
            f"tensor {show(name)} is {dtype} of shape {shape}, which takes {nbytes} bytes, but "
            f"its offsets span {offsets[1] - offsets[0]}",
            details={"tensor": name},
        )
    return TensorInfo(
        name=name,
        dtype=dtype,
        shape=tuple(shape),
        start=data_start + offsets[0],
        end=data_start + offsets[1],
    )


def read_header(
    source: str | Path | BinaryIO, *, max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
) -> Header:
    """Validate the header of a file on disk (or an open binary file) without reading tensors."""
    if isinstance(source, (str, Path)):
        with open(source, "rb") as fh:
            return read_header(fh, max_header_bytes=max_header_bytes)
    fh = source
    fh.seek(0, 2)
    size = fh.tell()
    fh.seek(0)
    first = fh.read(min(size, SNIFF_BYTES))
    sniff(first)
    n = header_length(first[:8], size, max_header_bytes=max_header_bytes)
    fh.seek(0)
    head = fh.read(8 + n)
    return parse_header(head, size, max_header_bytes=max_header_bytes)
