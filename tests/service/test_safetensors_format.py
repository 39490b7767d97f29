"""The stdlib header validator against the official writer and a corpus of broken files."""

from __future__ import annotations

import io
import json
import pickle
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save as st_save
from stitchsim.files.dataset import check_dataset, read_labels
from stitchsim.files.errors import InvalidDataset, SafetensorsError, UnsupportedFormat
from stitchsim.files.header import parse_header, read_header

from tests.service.helpers import dataset_bytes, raw_safetensors, safetensors_bytes


def _check(data: bytes, **kw: int):  # type: ignore[no-untyped-def]
    return read_header(io.BytesIO(data), **kw)


def test_official_writer_files_pass_with_their_figures() -> None:
    arrays = {"a": np.zeros((2, 3), np.float32), "b": np.arange(5, dtype=np.int64),
              "empty": np.zeros((0, 4), np.float16), "c": np.ones(7, np.uint8)}
    data = st_save(arrays, metadata={"arch": "resnet18", "arch_kwargs": '{"num_classes": 3}'})
    h = _check(data)
    assert h.n_tensors == 4
    assert h.arch == "resnet18"
    assert h.tensors["a"].shape == (2, 3) and h.tensors["a"].dtype == "F32"
    assert h.tensors["b"].end - h.tensors["b"].start == 40
    assert read_labels(io.BytesIO(data), h.tensors["b"]) == [0, 1, 2, 3, 4]


def test_checkpoint_fixture_header(ckpts) -> None:  # type: ignore[no-untyped-def]
    h = read_header(Path(ckpts.digits_resnet))
    assert h.arch == "test_resnet"
    assert json.loads(h.metadata["arch_kwargs"])["num_classes"] == 10


T = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
BROKEN: list[tuple[str, bytes, type[SafetensorsError], str]] = [
    ("pickle", pickle.dumps({"w": [1.0]}), UnsupportedFormat, "pickle"),
    ("zip", b"PK\x03\x04" + b"\0" * 100, UnsupportedFormat, "zip"),
    ("numpy", b"\x93NUMPY" + b"\0" * 100, UnsupportedFormat, "NumPy"),
    ("too short", b"\x01\x00", SafetensorsError, "too short"),
    ("header cap", raw_safetensors({"a": T}, b"\0" * 8, declared=1 << 40), SafetensorsError,
     "more than"),
    ("truncated header", raw_safetensors({"a": T}, b"", declared=500), SafetensorsError,
     "truncated"),
    ("truncated data", raw_safetensors({"a": T}, b"\0" * 4), SafetensorsError, "truncated"),
    ("trailing bytes", raw_safetensors({"a": T}, b"\0" * 12), SafetensorsError, "after the last"),
    ("leading space", raw_safetensors(None, b"\0" * 8, raw_header=b' {"a": ' +
                                      json.dumps(T).encode() + b"}"), SafetensorsError,
     "must start with '{'"),
    ("not json", raw_safetensors(None, b"", raw_header=b"{nope}"), SafetensorsError,
     "not valid JSON"),
    ("duplicate key", raw_safetensors(None, b"\0" * 8, raw_header=(
        f'{{"a": {json.dumps(T)}, "a": {json.dumps(T)}}}').encode()), SafetensorsError,
     "twice"),
    ("bad dtype", raw_safetensors({"a": {**T, "dtype": "F128"}}, b"\0" * 8), SafetensorsError,
     "dtype"),
    ("negative shape", raw_safetensors({"a": {**T, "shape": [-2]}}, b"\0" * 8),
     SafetensorsError, "shape"),
    ("size mismatch", raw_safetensors({"a": {**T, "shape": [3]}}, b"\0" * 8), SafetensorsError,
     "takes 12 bytes"),
    ("overlap", raw_safetensors({"a": T, "b": T}, b"\0" * 8), SafetensorsError, "overlaps"),
    ("gap", raw_safetensors({"a": {**T, "data_offsets": [4, 12]}}, b"\0" * 12),
     SafetensorsError, "gap"),
    ("metadata not str", raw_safetensors({"__metadata__": {"n": 3}, "a": T}, b"\0" * 8),
     SafetensorsError, "must be a string"),
    ("arch_kwargs not json", raw_safetensors({"__metadata__": {"arch_kwargs": "{x"}, "a": T},
                                             b"\0" * 8), SafetensorsError, "JSON object"),
    ("extra field", raw_safetensors({"a": {**T, "x": 1}}, b"\0" * 8), SafetensorsError,
     "exactly dtype"),
    ("NaN constant", raw_safetensors(None, b"\0" * 8, raw_header=b'{"a": {"dtype": "F32", '
                                     b'"shape": [NaN], "data_offsets": [0, 8]}}'),
     SafetensorsError, "NaN"),
    ("bool shape", raw_safetensors({"a": {**T, "shape": [True, True]}}, b"\0" * 8),
     SafetensorsError, "shape"),
]


@pytest.mark.parametrize("name,data,exc,words", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_files_are_refused_with_a_reason(name: str, data: bytes,
                                                exc: type[SafetensorsError], words: str) -> None:
    with pytest.raises(exc) as info:
        _check(data)
    assert words in info.value.message


def test_header_cap_is_configurable() -> None:
    data = safetensors_bytes({"a": np.zeros(3, np.float32)}, {"x": "y" * 3000})
    _check(data)
    with pytest.raises(SafetensorsError, match="more than the 1024 bytes"):
        _check(data, max_header_bytes=1024)


def test_torch_zip_checkpoint_is_unsupported() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({}))
    with pytest.raises(UnsupportedFormat, match="torch.save"):
        parse_header(buf.getvalue(), len(buf.getvalue()))


def test_dataset_checks() -> None:
    info = check_dataset(io.BytesIO(dataset_bytes(n_train=30, n_test=12, c=1, hw=9)))
    assert (info.n_train, info.n_test, info.image_shape, info.n_classes) == (30, 12,
                                                                             (1, 9, 9), 10)
    bad = {
        "labels dtype": dataset_bytes(train_labels=np.zeros(40, np.float32)),
        "count mismatch": dataset_bytes(train_labels=np.zeros(39, np.int64)),
        "channels": dataset_bytes(n_train=4, n_test=4, c=2),
        "rank": dataset_bytes(train_images=np.zeros((40, 8, 8), np.uint8)),
        "negative label": dataset_bytes(test_labels=-np.ones(20, np.int64)),
        "shape mismatch": dataset_bytes(test_images=np.zeros((20, 3, 9, 9), np.uint8)),
        "missing tensor": safetensors_bytes({"train_images": np.zeros((2, 3, 8, 8), np.uint8)}),
    }
    for what, data in bad.items():
        with pytest.raises(InvalidDataset):
            check_dataset(io.BytesIO(data))
        assert what


def test_unlabelled_datasets_and_packing_metadata() -> None:
    # Both label tensors or neither; what `stitchsim dataset pack` records is checked.
    info = check_dataset(io.BytesIO(dataset_bytes(train_labels=None, test_labels=None)))
    assert not info.labelled and info.n_classes is None and info.classes is None
    packed = safetensors_bytes(
        _tensors(),
        {"classes": json.dumps([f"c{i}" for i in range(10)]), "source_format": "imagefolder",
         "test_split": json.dumps({"made": True, "fraction": 0.25, "seed": 3,
                                   "stratified": True}),
         "notes": json.dumps(["3 of 60 images resized"])})
    info = check_dataset(io.BytesIO(packed))
    assert info.classes == tuple(f"c{i}" for i in range(10))
    assert info.test_split is not None and info.test_split.describe() == (
        "made from the training split when packed: 25% of it, stratified by class, seed 3")
    assert info.notes == ("3 of 60 images resized",) and info.source_format == "imagefolder"
    refused = {
        "too few class names": ({"classes": json.dumps(["a", "b"])}, "names 2 classes"),
        "class names not a list": ({"classes": "{}"}, "JSON list of class names"),
        "a test split without a seed": ({"test_split": json.dumps({"made": True,
                                                                   "fraction": 0.2})},
                                        "test_split"),
        "notes not strings": ({"notes": "[1]"}, "list of strings"),
        "not JSON": ({"test_split": "made"}, "not valid JSON"),
    }
    for what, (meta, message) in refused.items():
        with pytest.raises(InvalidDataset, match=message):
            check_dataset(io.BytesIO(safetensors_bytes(_tensors(), meta)))
        assert what
    names = json.dumps(["a"] * 10)
    unlabelled = {k: v for k, v in _tensors().items() if "labels" not in k}
    with pytest.raises(InvalidDataset, match="holds no labels"):
        check_dataset(io.BytesIO(safetensors_bytes(unlabelled, {"classes": names})))


def _tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"train_images": rng.integers(0, 256, (40, 3, 8, 8), dtype=np.uint8),
            "train_labels": np.arange(40, dtype=np.int64) % 10,
            "test_images": rng.integers(0, 256, (20, 3, 8, 8), dtype=np.uint8),
            "test_labels": np.arange(20, dtype=np.int64) % 10}


def test_header_length_field_is_little_endian_u64() -> None:
    data = safetensors_bytes({"a": np.zeros(2, np.float32)})
    (n,) = struct.unpack("<Q", data[:8])
    assert _check(data).header_size == n


def test_one_dataset_rule_set() -> None:
    # The rules the client, the gateway and the engine share (stitchsim.files.dataset).
    for dtype in (np.uint8, np.int16, np.int32, np.int64):
        labels = {f"{s}_labels": np.arange(n, dtype=dtype) % 10 for s, n in
                  (("train", 40), ("test", 20))}
        assert check_dataset(io.BytesIO(dataset_bytes(**labels))).n_classes == 10
    refused = {
        "an extra tensor": (dataset_bytes(names=np.zeros(10, np.uint8)), "also holds names"),
        "int8 labels": (dataset_bytes(train_labels=np.zeros(40, np.int8)), "integer tensor"),
        "too few samples": (dataset_bytes(n_train=40, n_test=9), "at least 10"),
        "missing images": (safetensors_bytes({"train_images": np.zeros((20, 3, 8, 8), np.uint8)}),
                           "lacks test_images"),
        "labels of one split": (dataset_bytes(test_labels=None), "lacks test_labels"),
    }
    for what, (data, message) in refused.items():
        with pytest.raises(InvalidDataset, match=message):
            check_dataset(io.BytesIO(data))
        assert what
