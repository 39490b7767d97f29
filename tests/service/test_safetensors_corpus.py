"""A named corpus of malformed safetensors files.

Each file is refused by the header validator with a reason (no server), and, uploaded to
POST /checkpoints, POST /datasets and as the `front` file of a multipart POST /similarity,
gets the documented 4xx: 415 for other formats (a pickle, a torch.save zip), 413 beyond the
upload cap, 422 for a malformed file (a header over the header cap included: the upload itself
is within limits, its header is not a sane one). The message names what is wrong, stays
short whatever the file holds, and nothing is left behind: store and tmp files, rows of jobs,
objects and ownership are as before.
"""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest
from stitchsim.files.errors import SafetensorsError, UnsupportedFormat
from stitchsim.files.header import read_header

from tests.service.helpers import (
    TINY_SPEC,
    assert_error_body,
    raw_safetensors,
    safetensors_bytes,
    service_state,
    torch_zip_bytes,
)

T = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
T_JSON = json.dumps(T)
DATA = b"\0" * 8
HEADER_CAP = 16 * 1024 * 1024  # the service's default STITCHSIM_MAX_HEADER_BYTES
UPLOAD_CAP = 32 * 1024 * 1024  # STITCHSIM_MAX_UPLOAD_BYTES of the test services
MAX_MESSAGE_CHARS = 600
BIG_INT = "1" + "0" * 3000  # parses as JSON; the product of two overflows everything


@dataclass(frozen=True)
class Bad:
    name: str
    data: bytes
    status: int
    words: str  # must appear in the message
    dataset_words: str | None = None  # instead, where POST /datasets says it otherwise


def _text(header: str, data: bytes = DATA, **kw: Any) -> bytes:
    """A file whose header is exactly this text (padded with spaces)."""
    return raw_safetensors(None, data, raw_header=header.encode("utf-8"), **kw)


def _tensor(**over: Any) -> bytes:
    return raw_safetensors({"a": {**T, **over}}, DATA)


CORPUS = [
    Bad("header length larger than the file",
        raw_safetensors({"a": T}, DATA, declared=4096), 422, "the file is truncated"),
    Bad("header length smaller than the JSON",
        raw_safetensors({"a": T}, DATA, declared=16), 422, "wrong header length"),
    Bad("header length 0", raw_safetensors({"a": T}, DATA, declared=0), 422, "header length"),
    Bad("overlapping offsets", raw_safetensors({"a": T, "b": T}, DATA), 422, "overlaps"),
    Bad("gap between offsets", raw_safetensors(
        {"a": T, "b": {**T, "data_offsets": [12, 20]}}, b"\0" * 20), 422, "gap"),
    Bad("offsets past the end", raw_safetensors({"a": T}, b"\0" * 4), 422, "truncated"),
    Bad("reversed offsets", _tensor(data_offsets=[8, 0]), 422, "0 <= begin <= end"),
    Bad("negative offsets", _tensor(data_offsets=[-8, 0]), 422, "0 <= begin <= end"),
    Bad("non-integer offsets", _tensor(data_offsets=[0, 8.0]), 422, "0 <= begin <= end"),
    Bad("string offsets", _tensor(data_offsets=["0", "8"]), 422, "data_offsets"),
    Bad("duplicate keys", _text(f'{{"a": {T_JSON}, "a": {T_JSON}}}'), 422, "'a' twice"),
    Bad("bad dtype", _tensor(dtype="C64"), 422, "dtype 'C64'"),
    Bad("dtype not a string", _tensor(dtype=4), 422, "dtype 4"),
    Bad("dtype/shape size mismatch", _tensor(shape=[3]), 422, "takes 12 bytes"),
    Bad("huge declared shape (product overflows 64 bits)", _tensor(shape=[2**40, 2**40]), 422,
        "64 bits"),
    Bad("huge dims (thousands of digits)", _text(
        f'{{"a": {{"dtype": "F32", "shape": [{BIG_INT}, {BIG_INT}], "data_offsets": [0, 8]}}}}'),
        422, "64 bits"),
    Bad("negative dims", _tensor(shape=[-2]), 422, "non-negative integers"),
    Bad("rank 9", _tensor(shape=[1] * 8 + [2]), 422, "at most 8"),
    Bad("trailing bytes", raw_safetensors({"a": T}, b"\0" * 16), 422, "cover the file exactly"),
    Bad("non-JSON header", _text("{a: F32}"), 422, "not valid JSON"),
    Bad("non-UTF-8 header", raw_safetensors(None, DATA, raw_header=b'{"a\xff": ' +
                                            T_JSON.encode() + b"}"), 422, "not valid UTF-8"),
    Bad("lone surrogate in a tensor name", _text(f'{{"\\ud800": {T_JSON}}}'), 422,
        "surrogate"),
    Bad("lone surrogate in metadata", _text(
        f'{{"__metadata__": {{"arch": "\\udfff"}}, "a": {T_JSON}}}'), 422, "surrogate"),
    Bad("JSON that is not an object", _text(f"[{T_JSON}]"), 422, "must start with '{'"),
    Bad("header padded with NUL bytes", raw_safetensors(None, DATA, pad=False, raw_header=(
        T_JSON.join(['{"a": ', "}"]).encode() + b"\0" * 6)), 422, "padded only with spaces"),
    Bad("__metadata__ not a dict", raw_safetensors({"__metadata__": ["arch"], "a": T}, DATA),
        422, "__metadata__ must be a JSON object"),
    Bad("__metadata__ non-string value", raw_safetensors(
        {"__metadata__": {"epochs": 3}, "a": T}, DATA), 422, "must be a string"),
    Bad("tensor entry missing a field", raw_safetensors({"a": {"dtype": "F32", "shape": [2]}},
                                                        DATA), 422, "exactly dtype"),
    Bad("header over the cap", raw_safetensors(
        {"__metadata__": {"pad": "x" * HEADER_CAP}, "a": T}, DATA), 422, "more than the"),
    Bad("header length over the cap (small file)", raw_safetensors(
        {"a": T}, DATA, declared=1 << 40), 422, "more than the"),
    Bad("deeply nested JSON", _text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", b""), 422,
        "not valid JSON"),
    Bad("arch_kwargs nested past the parser", raw_safetensors({"__metadata__": {
        "arch_kwargs": '{"a":' * 5000 + "1" + "}" * 5000}, "a": T}, DATA), 422,
        "arch_kwargs'] must hold a JSON object"),
    Bad("arch_kwargs nested 40 levels", raw_safetensors({"__metadata__": {
        "arch_kwargs": '{"a":' * 40 + "1" + "}" * 40}, "a": T}, DATA), 422,
        "nested more than 32 levels"),
    Bad("NaN in JSON", _text('{"a": {"dtype": "F32", "shape": [NaN], "data_offsets": [0, 8]}}'),
        422, "NaN"),
    Bad("Infinity in JSON", _text(
        '{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, Infinity]}}'), 422,
        "Infinity"),
    Bad("megabyte dtype string", _tensor(dtype="X" * 1_000_000), 422, "dtype 'XXX"),
    Bad("million-entry shape", _tensor(shape=[1] * 1_000_000), 422, "at most 8"),
    Bad("megabyte metadata key", raw_safetensors(
        {"__metadata__": {"k" * 1_000_000: 1}, "a": T}, DATA), 422, "must be a string"),
    Bad("pickle renamed .safetensors", pickle.dumps({"weight": np.zeros(2)}), 415, "pickle"),
    # A zip sent as a dataset is more likely a zipped image folder or an npz (issue 38).
    Bad("torch.save zip", torch_zip_bytes(), 415, "torch.save",
        dataset_words="pack it into the service's dataset file with `stitchsim dataset pack"),
    Bad("empty file", b"", 422, "empty"),
    Bad("7 bytes", b"\x07\0\0\0\0\0\0", 422, "too short"),
    Bad("over the upload cap", raw_safetensors(
        {"a": {"dtype": "U8", "shape": [UPLOAD_CAP], "data_offsets": [0, UPLOAD_CAP]}},
        b"\0" * UPLOAD_CAP), 413, "larger than"),
]
CODES = {413: "too_large", 415: "unsupported_format", 422: "invalid_safetensors"}
# A small valid file: the back model beside a broken front, which must not be kept either.
VALID = safetensors_bytes({"w": np.zeros(4, np.float32)}, {"arch": "test_resnet"})


def _upload(endpoint: str) -> Callable[[httpx.Client, bytes], httpx.Response]:
    def call(client: httpx.Client, data: bytes) -> httpx.Response:
        return client.post(endpoint, files={"file": ("model.safetensors", data)})
    return call


def _similarity_front(client: httpx.Client, data: bytes) -> httpx.Response:
    return client.post("/similarity", data={"spec": json.dumps(TINY_SPEC)},
                       files={"front": ("front.safetensors", data),
                              "back": ("back.safetensors", VALID)})


ENDPOINTS = {"checkpoints": _upload("/checkpoints"), "datasets": _upload("/datasets"),
             "similarity front": _similarity_front}


def test_corpus_names_are_unique_and_the_control_file_is_valid() -> None:
    assert len({b.name for b in CORPUS}) == len(CORPUS) >= 30
    assert read_header(io.BytesIO(VALID)).n_tensors == 1


@pytest.mark.parametrize("bad", [b for b in CORPUS if b.status != 413],
                         ids=lambda b: b.name)
def test_validator_refuses_with_a_reason(bad: Bad) -> None:
    expected = UnsupportedFormat if bad.status == 415 else SafetensorsError
    with pytest.raises(expected) as info:
        read_header(io.BytesIO(bad.data))
    assert bad.words in info.value.message, info.value.message
    assert len(info.value.message) < MAX_MESSAGE_CHARS, info.value.message[:200]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("bad", CORPUS, ids=lambda b: b.name)
def test_upload_is_refused_and_leaves_nothing(bad: Bad, endpoint: str,
                                              redis_service: Any) -> None:
    svc = redis_service
    before = service_state(svc)
    with svc.client() as client:
        response = ENDPOINTS[endpoint](client, bad.data)
    assert response.status_code == bad.status, response.text[:500]
    err = assert_error_body(response)
    assert err["code"] == CODES[bad.status], err
    words = bad.dataset_words if endpoint == "datasets" and bad.dataset_words else bad.words
    assert words in err["message"], err["message"][:500]
    assert len(err["message"]) < MAX_MESSAGE_CHARS, err["message"][:200]
    assert service_state(svc) == before, f"{bad.name} via {endpoint} left something behind"
