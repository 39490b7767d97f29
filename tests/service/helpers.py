"""Builders for test inputs: hand-made safetensors bytes (valid and broken), tiny specs."""

from __future__ import annotations

import json
import struct
import time
from typing import Any

import numpy as np

_NP_DTYPES = {"F32": np.float32, "U8": np.uint8, "I8": np.int8, "I16": np.int16,
              "I32": np.int32, "I64": np.int64, "F16": np.float16}

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


def restamp(data: bytes, **metadata: str) -> bytes:
    """The same tensors with metadata added: new bytes, so a new id that no other test (or key)
    has uploaded, for a file that still loads."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header["__metadata__"] = {**header.get("__metadata__", {}), **metadata}
    return raw_safetensors(header, data[8 + n:])


def dataset_bytes(n_train: int = 40, n_test: int = 20, c: int = 3, hw: int = 8,
                  n_classes: int = 10, **overrides: np.ndarray) -> bytes:
    rng = np.random.default_rng(0)
    tensors = {
        "train_images": rng.integers(0, 256, (n_train, c, hw, hw), dtype=np.uint8),
        "train_labels": np.arange(n_train, dtype=np.int64) % n_classes,
        "test_images": rng.integers(0, 256, (n_test, c, hw, hw), dtype=np.uint8),
        "test_labels": np.arange(n_test, dtype=np.int64) % n_classes,
    }
    tensors.update(overrides)  # an override of None leaves the tensor out
    return safetensors_bytes({k: v for k, v in tensors.items() if v is not None})


def torch_zip_bytes() -> bytes:
    """What `torch.save` writes: a zip archive holding a pickle."""
    import io

    import torch

    buf = io.BytesIO()
    torch.save({"weight": torch.zeros(2)}, buf)
    return buf.getvalue()


# Routes anyone may call without a key: the probes an orchestrator and Prometheus call without
# credentials, and the API's own description and docs pages (no user data in any of them).
# Every other route needs a key when keys are required.
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json", "/docs",
                          "/docs/oauth2-redirect", "/redoc"})


def assert_error_body(response: Any) -> dict[str, Any]:
    """A 4xx/5xx body has exactly the contract's error shape and says something; returns it."""
    assert "Traceback" not in response.text, response.text
    data = response.json()
    assert set(data) == {"error"}, data
    err = data["error"]
    assert set(err) == {"code", "message", "details"}, err
    assert isinstance(err["code"], str) and err["code"], err
    assert isinstance(err["message"], str) and err["message"].strip(), err
    return dict(err)


def service_state(svc: Any) -> tuple[list[str], int, int, int]:
    """What a refused request must not change: store and tmp files, rows of jobs, objects and
    ownership."""
    return (svc.store_files(), svc.count_rows("jobs"), svc.count_rows("objects"),
            svc.count_rows("ownership"))


def wait_for(what: str, check: Any, timeout: float = 120, svc: Any = None) -> Any:
    """check()'s first truthy answer, polled; past the timeout, an error with the service's
    log (svc: a ServiceHandle, or None)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{what} not within {timeout} s\n{svc.logs() if svc else ''}")
