"""What a safetensors file from a stranger may hold. The format itself allows more (and its
official loader accepts a 100 MB header); a service must not."""

from __future__ import annotations

DEFAULT_MAX_HEADER_BYTES = 16 * 1024 * 1024
MAX_TENSORS = 100_000
MAX_RANK = 8
MAX_NAME_CHARS = 1024
MAX_METADATA_VALUE_CHARS = 1024 * 1024
MAX_U64 = 2**64 - 1
"""Sizes and offsets are u64 in the format (and in every reader of it)."""

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
"""The dtypes accepted, with their size in bytes."""

SNIFF_BYTES = 300
"""How much of a file's start tells other formats apart."""

# Datasets
IMAGE_DTYPES = ("U8", "F16", "BF16", "F32", "F64")
LABEL_DTYPES = ("U8", "I16", "I32", "I64")
MIN_SAMPLES = 10
"""Per split: fewer cannot give a test figure worth reading (nor a stitch fit)."""
MAX_CLASSES = 10_000
MAX_IMAGE_SIDE = 1024
