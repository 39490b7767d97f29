"""Builders for test inputs: hand-made safetensors bytes (valid and broken), tiny specs."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

_NP_DTYPES = {"F32": np.float32, "U8": np.uint8, "I64": np.int64, "F16": np.float16}

# Small enough that one job takes a few seconds on two CPU cores.
TINY_SPEC: dict[str, Any] = {
    "dataset": "digits",
    "layers": [{"front": "layer1", "back": "layer1"}],
    "objectives": ["slm"],
    "protocols": ["standard"],
    "directions": "front_to_back",
    "train": {"epochs": 1, "max_train_samples": 200, "max_test_samples": 100, "seed": 3},
    "iri": {"steps": 5},
}


def raw_safetensors(header: Any, data: bytes = b"", *, raw_header: bytes | None = None,
                    declared: int | None = None, pad: bool = True) -> bytes:
    """Bytes of a safetensors file with exactly the header given (no checks)."""
    text = raw_header if raw_header is not None else json.dumps(header).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    n = len(text) if declared is None else declared
    return struct.pack("<Q", n) + text + data


def safetensors_bytes(tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None
                      ) -> bytes:
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    data = b""
    names = {np.dtype(v).name: k for k, v in _NP_DTYPES.items()}
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": names[arr.dtype.name], "shape": list(arr.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    return raw_safetensors(header, data)


def dataset_bytes(n_train: int = 40, n_test: int = 20, c: int = 3, hw: int = 8,
                  n_classes: int = 10, **overrides: np.ndarray) -> bytes:
    rng = np.random.default_rng(0)
    tensors = {
        "train_images": rng.integers(0, 256, (n_train, c, hw, hw), dtype=np.uint8),
        "train_labels": np.arange(n_train, dtype=np.int64) % n_classes,
        "test_images": rng.integers(0, 256, (n_test, c, hw, hw), dtype=np.uint8),
        "test_labels": np.arange(n_test, dtype=np.int64) % n_classes,
    }
    tensors.update(overrides)
    return safetensors_bytes(tensors)
