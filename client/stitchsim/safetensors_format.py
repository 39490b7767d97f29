"""Strict safetensors header validation, stdlib only.

The official loader is too lenient for files that come from strangers: it accepts duplicate
tensor names, headers that start with a space, a 100 MB header, and does not insist that the
data offsets tile the file. These checks run on the first bytes of a file before anything else
reads it, in the gateway (on upload) and in the client (before uploading).

A file is laid out as: 8 bytes little-endian u64 N, N bytes of UTF-8 JSON (right-padded with
spaces), then the tensor bytes; every tensor's ``data_offsets`` are relative to the byte just
after the header.
"""

from __future__ import annotations

import json
import math
import reprlib
import struct
import sys
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

DEFAULT_MAX_HEADER_BYTES = 16 * 1024 * 1024
MAX_TENSORS = 100_000
MAX_RANK = 8
MAX_NAME_CHARS = 1024
MAX_METADATA_VALUE_CHARS = 1024 * 1024
MAX_U64 = 2**64 - 1
"""Sizes and offsets are u64 in the format (and in every reader of it)."""
MAX_JSON_DEPTH = 32
"""Nesting accepted in JSON from strangers (arch_kwargs, specs): real ones are a few levels
deep; parsers, pydantic and json.dumps each fail somewhere beyond a hundred."""

DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "U16": 2,
    "I16": 2,
    "F16": 2,
    "BF16": 2,
    "U32": 4,
    "I32": 4,
    "F32": 4,
    "U64": 8,
    "I64": 8,
    "F64": 8,
}

IMAGE_DTYPES = ("U8", "F16", "BF16", "F32", "F64")
DATASET_TENSORS = ("train_images", "train_labels", "test_images", "test_labels")
MAX_CLASSES = 10_000
MAX_IMAGE_SIDE = 1024

_EXPORT_HINT = (
    "export the weights with safetensors, e.g. "
    "`safetensors.torch.save_file(model.state_dict(), 'model.safetensors')`"
)


class SafetensorsError(ValueError):
    """The file is not a safetensors file we accept; ``message`` says what to fix."""

    code = "invalid_safetensors"

    def __init__(self, message: str, *, details: Any = None):
        super().__init__(message)
        self.message = message
        self.details = details


class UnsupportedFormat(SafetensorsError):
    """The file is another format (pickle, zip, numpy …): refused without parsing it."""

    code = "unsupported_format"


class InvalidDataset(SafetensorsError):
    """A valid safetensors file that does not hold a usable dataset."""

    code = "invalid_dataset"


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


@dataclass(frozen=True)
class DatasetFileInfo:
    n_train: int
    n_test: int
    image_shape: tuple[int, int, int]
    image_dtype: str
    n_classes: int


# Values from the file appear in error messages cut short: a message must not echo megabytes
# of a hostile header back (or into logs).
_SHORT = reprlib.Repr()
_SHORT.maxstring = 60
_SHORT.maxother = 60
_SHORT.maxlong = 30
_SHORT.maxlist = _SHORT.maxdict = 10


def _show(value: Any) -> str:
    return _SHORT.repr(value)


# ---------------------------------------------------------------- sniffing

_MAGICS: tuple[tuple[bytes, str], ...] = (
    (b"PK\x03\x04", "a zip archive (PyTorch's torch.save format, which holds a pickle)"),
    (b"PK\x05\x06", "an empty zip archive"),
    (b"\x93NUMPY", "a NumPy .npy file"),
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file (Keras .h5?)"),
    (b"GGUF", "a GGUF file"),
    (b"\x1f\x8b", "a gzip file"),
    (b"\xfd7zXZ", "an xz file"),
    (b"BZh", "a bzip2 file"),
    (b"ustar", "a tar archive"),
)


def sniff(first: bytes) -> None:
    """Refuse well-known non-safetensors formats from the first bytes (at least 9 given).

    Raises UnsupportedFormat; returns quietly when the bytes may start a safetensors file.
    """
    for magic, what in _MAGICS:
        if first.startswith(magic):
            raise UnsupportedFormat(f"this file is {what}, not safetensors; {_EXPORT_HINT}")
    # Pickle protocol 2+ starts with PROTO (0x80) and the protocol number; protocol 0/1 pickles
    # start with an opcode such as '(' or ']' or 'c'. None of these can begin a safetensors
    # file, whose first 8 bytes are a header length that is < 2**56 and whose 9th byte is '{'.
    if first[:1] == b"\x80" and first[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        raise UnsupportedFormat(
            f"this file is a Python pickle, which can run code when loaded; {_EXPORT_HINT}"
        )
    if len(first) > 262 and first[257:262] == b"ustar":
        raise UnsupportedFormat(f"this file is a tar archive, not safetensors; {_EXPORT_HINT}")
    # Protocol 0/1 pickles start with an opcode; a safetensors file may too (it is the low byte
    # of the header length), but then its 9th byte is '{'.
    if len(first) >= 9 and first[8:9] != b"{" and first[:1] in (b"(", b"]", b"}", b"c", b"q"):
        raise UnsupportedFormat(
            f"this file looks like a Python pickle (protocol 0/1), not safetensors; {_EXPORT_HINT}"
        )


# ---------------------------------------------------------------- header


def _reject_constant(name: str) -> Any:
    raise SafetensorsError(f"the header JSON contains {name}, which is not valid JSON")


def _pairs_no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise SafetensorsError(
                f"the header names {_show(key)} twice; every tensor and metadata key must be "
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
    sniff(head[:300])
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
                f"tensor {_show(t.name)} starts at data offset {begin} but the previous tensor "
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


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether a parsed JSON value has objects or arrays nested more than limit levels deep
    (iterative: a hostile value must not exhaust the stack here either)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1)
                         for child in (item.values() if isinstance(item, dict) else item))
    return False


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
                f"__metadata__[{_show(key)}] must be a string (JSON-encode structured values, e.g. "
                "arch_kwargs), got " + type(value).__name__
            )
        if len(value) > MAX_METADATA_VALUE_CHARS:
            raise SafetensorsError(f"__metadata__[{_show(key)}] is too long")
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
    return dict(meta)


def _check_tensor(name: str, entry: Any, data_start: int) -> TensorInfo:
    if not name or len(name) > MAX_NAME_CHARS:
        raise SafetensorsError("tensor names must be 1 to 1024 characters long")
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise SafetensorsError(
            f"tensor {_show(name)} must be an object with exactly dtype, shape and data_offsets",
            details={"tensor": name},
        )
    dtype = entry["dtype"]
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise SafetensorsError(
            f"tensor {_show(name)} has dtype {_show(dtype)}; accepted: {', '.join(DTYPE_SIZES)}",
            details={"tensor": name, "dtype": _show(dtype)},
        )
    shape = entry["shape"]
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_RANK
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise SafetensorsError(
            f"tensor {_show(name)} has shape {_show(shape)}; a shape is a list of at most "
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
            f"tensor {_show(name)} has data_offsets {_show(offsets)}; expected [begin, end] with "
            "0 <= begin <= end < 2**64",
            details={"tensor": name},
        )
    nbytes = math.prod(shape) * DTYPE_SIZES[dtype]
    if nbytes > MAX_U64:
        raise SafetensorsError(
            f"tensor {_show(name)} is {dtype} of shape {_show(shape)}, whose size in bytes "
            "overflows 64 bits",
            details={"tensor": name},
        )
    if offsets[1] - offsets[0] != nbytes:
        raise SafetensorsError(
            f"tensor {_show(name)} is {dtype} of shape {shape}, which takes {nbytes} bytes, but "
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
    first = fh.read(min(size, 300))
    sniff(first)
    n = header_length(first[:8], size, max_header_bytes=max_header_bytes)
    fh.seek(0)
    head = fh.read(8 + n)
    return parse_header(head, size, max_header_bytes=max_header_bytes)


# ---------------------------------------------------------------- datasets


def read_labels(source: str | Path | BinaryIO, tensor: TensorInfo) -> list[int]:
    """The values of a 1-D I64 tensor."""
    if tensor.dtype != "I64" or len(tensor.shape) != 1:
        raise InvalidDataset(f"{tensor.name} must be a 1-D int64 tensor")
    if isinstance(source, (str, Path)):
        with open(source, "rb") as fh:
            return read_labels(fh, tensor)
    source.seek(tensor.start)
    raw = source.read(tensor.end - tensor.start)
    if len(raw) != tensor.end - tensor.start:
        raise InvalidDataset(f"{tensor.name} is truncated")
    values = array("q")
    values.frombytes(raw)
    if sys.byteorder != "little":
        values.byteswap()
    return values.tolist()


def check_dataset(
    source: str | Path | BinaryIO,
    header: Header | None = None,
    *,
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
) -> DatasetFileInfo:
    """Check that a safetensors file holds a usable image-classification dataset."""
    if header is None:
        header = read_header(source, max_header_bytes=max_header_bytes)
    names = set(header.tensors)
    missing = [n for n in DATASET_TENSORS if n not in names]
    extra = sorted(names - set(DATASET_TENSORS))
    if missing or extra:
        parts = []
        if missing:
            parts.append("missing " + ", ".join(missing))
        if extra:
            parts.append("unexpected " + ", ".join(extra[:10]))
        raise InvalidDataset(
            "a dataset file holds exactly train_images, train_labels, test_images and "
            "test_labels: " + "; ".join(parts),
            details={"missing": missing, "unexpected": extra},
        )
    shapes: dict[str, tuple[int, int, int]] = {}
    counts: dict[str, int] = {}
    dtypes: set[str] = set()
    for split in ("train", "test"):
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
                f"{split}_images has {c} channels; expected 1 or 3 (channels first: N x C x H x W)"
            )
        if not (1 <= h <= MAX_IMAGE_SIDE and 1 <= w <= MAX_IMAGE_SIDE):
            raise InvalidDataset(
                f"{split}_images are {h}x{w}; sides must lie in 1..{MAX_IMAGE_SIDE}"
            )
        if n < 1:
            raise InvalidDataset(f"{split}_images holds no images")
        if labels.dtype != "I64" or len(labels.shape) != 1:
            raise InvalidDataset(
                f"{split}_labels must be a 1-D int64 tensor, got {labels.dtype} of shape "
                f"{list(labels.shape)}"
            )
        if labels.shape[0] != n:
            raise InvalidDataset(
                f"{split}_images holds {n} images but {split}_labels holds {labels.shape[0]} labels"
            )
        shapes[split] = (c, h, w)
        counts[split] = n
        dtypes.add(images.dtype)
    if shapes["train"] != shapes["test"]:
        raise InvalidDataset(
            f"train images are {list(shapes['train'])} but test images are "
            f"{list(shapes['test'])}; both splits need the same C x H x W"
        )
    if len(dtypes) != 1:
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
    return DatasetFileInfo(
        n_train=counts["train"],
        n_test=counts["test"],
        image_shape=shapes["train"],
        image_dtype=dtypes.pop(),
        n_classes=top + 1,
    )
