"""A table of bad inputs: each gets the right 4xx, a message that says what to fix, and leaves
nothing behind in the store or the job table."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest
from stitchsim import catalogue

from tests.service.conftest import tiny_spec, upload
from tests.service.helpers import (
    dataset_bytes,
    raw_safetensors,
    restamp,
    safetensors_bytes,
    torch_zip_bytes,
)

T = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@dataclass
class Case:
    name: str
    call: Callable[[httpx.Client, dict[str, Any]], httpx.Response]
    status: int
    code: str
    words: str  # must appear in the message


def _file(data: bytes, endpoint: str = "/checkpoints") -> Callable[..., httpx.Response]:
    return lambda c, env: c.post(endpoint, files={"file": ("x.safetensors", data)})


def _spec(**over: Any) -> Callable[..., httpx.Response]:
    def call(c: httpx.Client, env: dict[str, Any]) -> httpx.Response:
        spec = tiny_spec({"checkpoint": env["front"]}, {"checkpoint": env["back"]})
        for key, value in over.items():
            if value is _DROP:
                spec.pop(key)
            else:
                spec[key] = value(env) if callable(value) else value
        return c.post("/similarity", json=spec)
    return call


_DROP = object()


def _allowed(names: tuple[str, ...]) -> str:
    """How the message lists a catalogue kind's names: 'a', 'b' or 'c'."""
    quoted = [repr(n) for n in names]
    return " or ".join([", ".join(quoted[:-1]), quoted[-1]] if len(quoted) > 1 else quoted)


def _multipart_new_files_bad_layer(c: httpx.Client, env: dict[str, Any]) -> httpx.Response:
    # Files never uploaded before: they reach the store for the spec check, which fails, and
    # must be rolled back.
    spec = tiny_spec({}, {}, layers=[{"front": "no_such_layer", "back": "layer1"}])
    del spec["front"], spec["back"]
    with open(env["vit"], "rb") as f, open(env["marker"], "rb") as b:
        return c.post("/similarity", files={"front": f, "back": b},
                      data={"spec": json.dumps(spec)})


def _chunked_too_large(c: httpx.Client, env: dict[str, Any]) -> httpx.Response:
    head = raw_safetensors({"a": {"dtype": "U8", "shape": [40 << 20],
                                  "data_offsets": [0, 40 << 20]}})

    def body() -> Iterator[bytes]:
        yield head
        for _ in range(40):
            yield b"\0" * (1 << 20)

    return c.post("/checkpoints", content=body(),
                  headers={"content-type": "application/octet-stream"})


def _declared_too_large(c: httpx.Client, env: dict[str, Any]) -> httpx.Response:
    data = raw_safetensors({"a": {"dtype": "U8", "shape": [33 << 20],
                                  "data_offsets": [0, 33 << 20]}}, b"\0" * (33 << 20))
    return c.post("/checkpoints", content=data,
                  headers={"content-type": "application/octet-stream"})


def _with_config(config: str, **more: str) -> bytes:
    """A packed model folder: its config.json travels in the file's metadata."""
    return safetensors_bytes({"a": np.zeros(2, np.float32)},
                             metadata={"config.json": config, **more})


_HF = {"model_type": "convnext", "architectures": ["ConvNextForImageClassification"],
       "hidden_sizes": [8, 16], "depths": [1, 1], "num_stages": 2, "num_labels": 10}


def _submit_folder(config: dict[str, Any]) -> Callable[..., httpx.Response]:
    # New files with the submission: the config is judged by the spec check, at submission,
    # and the files it refuses are rolled back with the job.
    def call(c: httpx.Client, env: dict[str, Any]) -> httpx.Response:
        spec = tiny_spec({}, {})
        del spec["front"], spec["back"]
        return c.post("/similarity", files={"front": _with_config(json.dumps(config)),
                                            "back": env["front_path"].read_bytes()},
                      data={"spec": json.dumps(spec)})
    return call


CASES = [
    Case("config.json with auto_map", _file(_with_config(json.dumps(
        {**_HF, "auto_map": {"AutoModel": "evil.Model"}}))), 422, "invalid_model_config",
        "field 'auto_map'"),
    Case("config.json not JSON", _file(_with_config("{model_type: vit")), 422,
         "invalid_model_config", "config.json is not valid JSON"),
    Case("config.json over its cap", _file(_with_config(json.dumps(
        {**_HF, "pad": "x" * 300_000}))), 422, "invalid_model_config", "more than the"),
    Case("config.json of an unknown model type", _submit_folder({**_HF, "model_type": "nope"}),
         422, "invalid_model_config", "config.json: field 'model_type'"),
    Case("config.json of an unknown class", _submit_folder(
        {**_HF, "architectures": ["NoSuchForImageClassification"]}), 422, "unknown_arch",
        "config.json field 'architectures'"),
    Case("config.json that does not fit the weights", _submit_folder(_HF), 422,
         "weights_mismatch", "as config.json describes it: missing keys"),
    Case("pickle", _file(pickle.dumps({"weight": [1.0, 2.0]})), 415, "unsupported_format",
         "safetensors"),
    Case("torch.save zip", _file(torch_zip_bytes()), 415, "unsupported_format", "torch.save"),
    Case("truncated", _file(raw_safetensors({"a": T}, b"\0" * 5)), 422, "invalid_safetensors",
         "truncated"),
    Case("empty file", _file(b""), 422, "invalid_safetensors", "empty"),
    Case("header too long", _file(raw_safetensors({"a": T}, b"\0" * 8, declared=1 << 33)), 422,
         "invalid_safetensors", "more than"),
    Case("duplicate tensor", _file(raw_safetensors(None, b"\0" * 8, raw_header=(
        f'{{"a": {json.dumps(T)}, "a": {json.dumps(T)}}}').encode())), 422,
        "invalid_safetensors", "twice"),
    Case("leading space", _file(raw_safetensors(None, b"\0" * 8, raw_header=(
        f' {{"a": {json.dumps(T)}}}').encode())), 422, "invalid_safetensors", "start with '{'"),
    Case("trailing bytes", _file(raw_safetensors({"a": T}, b"\0" * 16)), 422,
         "invalid_safetensors", "cover the file exactly"),
    Case("bad dtype", _file(raw_safetensors({"a": {**T, "dtype": "C64"}}, b"\0" * 8)), 422,
         "invalid_safetensors", "dtype"),
    Case("oversized (declared)", _declared_too_large, 413, "too_large", "larger than"),
    Case("oversized (chunked)", _chunked_too_large, 413, "too_large", "larger than"),
    Case("wrong form field", lambda c, env: c.post("/checkpoints", files={"weights": b"x"}), 400,
         "bad_request", "unexpected form field"),
    Case("text/plain upload", lambda c, env: c.post(
        "/checkpoints", content=b"hello", headers={"content-type": "text/plain"}), 415,
        "unsupported_media_type", "multipart/form-data"),
    Case("dataset float labels", _file(dataset_bytes(train_labels=np.zeros(40, np.float32)),
                                       "/datasets"), 422, "invalid_dataset", "int64"),
    Case("dataset count mismatch", _file(dataset_bytes(test_labels=np.zeros(7, np.int64)),
                                         "/datasets"), 422, "invalid_dataset", "labels"),
    Case("dataset labels of one split", _file(dataset_bytes(test_labels=None), "/datasets"),
         422, "invalid_dataset", "lacks test_labels"),
    Case("dataset with a malformed test-split record", _file(
        restamp(dataset_bytes(), test_split='{"made": true}'), "/datasets"), 422,
        "invalid_dataset", "__metadata__['test_split'] must be"),
    Case("unknown arch", _spec(front=lambda env: {"checkpoint": env["front"],
                                                  "arch": "resnet_999"}),
         422, "unknown_arch", "not a timm architecture"),
    Case("hub arch", _spec(front=lambda env: {"checkpoint": env["front"],
                                              "arch": "hf-hub:evil/model"}),
         422, "invalid_spec", "plain timm model name"),
    Case("weights do not fit", _spec(front=lambda env: {"checkpoint": env["front"],
                                                        "arch": "resnet18"}),
         422, "weights_mismatch", "does not fit"),
    Case("missing layer", _spec(layers=[{"front": "layer9", "back": "layer1"}]), 422,
         "unknown_layer", "layer9"),
    Case("new files, missing layer", _multipart_new_files_bad_layer, 422, "unknown_layer",
         "no_such_layer"),
    Case("epochs 0", _spec(train={"epochs": 0}), 422, "invalid_spec", "train.epochs"),
    Case("unknown objective", _spec(objectives=["accuracy"]), 422, "invalid_spec",
         "objectives"),
    Case("unknown field", _spec(epochs=3), 422, "invalid_spec", "epochs"),
    Case("unknown iri.method", _spec(iri={"method": "momentum"}), 422, "invalid_spec",
         f"iri.method: Input should be {_allowed(catalogue.IRI_METHODS.names)}"),
    Case("unknown dataset", _spec(dataset="imagenet"), 422, "unknown_dataset", "built-in"),
    Case("cross_task without front_dataset", _spec(protocols=["cross_task"], objectives=["hlm"]),
         422, "invalid_spec", "front_dataset"),
    Case("unknown front_dataset", _spec(protocols=["cross_task"], objectives=["hlm"],
                                        front_dataset="imagenet"),
         422, "unknown_dataset", "front_dataset"),
    Case("alpha above 1", _spec(adversarial={"alpha": 1.5}), 422, "invalid_spec",
         "adversarial.alpha"),
    Case("an alpha below 0", _spec(adversarial={"alphas": [-0.5, 1]}), 422, "invalid_spec",
         "adversarial.alphas"),
    Case("unknown attack", _spec(adversarial={"attack": "fgsm"}), 422, "invalid_spec",
         "adversarial.attack: Input should be 'autoattack_paper', 'apgd' or 'pgd'"),
    Case("class_pairing not a permutation", _spec(class_pairing=[0, 0, 2]), 422,
         "invalid_spec", "permutation"),
    Case("dataset never uploaded", _spec(dataset="sha256:" + "ab" * 32), 404, "not_found",
         "POST /datasets"),
    Case("malformed checkpoint id", _spec(back={"checkpoint": "sha256:xyz"}), 422,
         "invalid_spec", "64 hex"),
    Case("other key's checkpoint", _spec(back=lambda env: {"checkpoint": env["others"]}), 404,
         "not_found", "POST /checkpoints"),
    Case("local path", _spec(back={"checkpoint": {"path": "/etc/passwd"}}), 422,
         "local_path_refused", "stitchsim-server run"),
    Case("back missing", _spec(back=_DROP), 422, "invalid_spec", "back"),
    Case("spec field not JSON", lambda c, env: c.post(
        "/similarity", files={"front": env["front_path"].read_bytes()},
        data={"spec": "{epochs: 3"}), 400, "bad_request", "not valid JSON"),
    Case("body not JSON", lambda c, env: c.post(
        "/similarity", content=b"{nope", headers={"content-type": "application/json"}), 400,
        "bad_request", "not valid JSON"),
    Case("spec not an object", lambda c, env: c.post("/similarity", json=[1, 2]), 422,
         "invalid_spec", "JSON object"),
    Case("submission as text", lambda c, env: c.post(
        "/similarity", content=b"hi", headers={"content-type": "text/plain"}), 415,
        "unsupported_media_type", "application/json"),
    Case("no API key", lambda c, env: httpx.post(env["url"] + "/similarity", json={}), 401,
         "unauthorized", "API key is required"),
    Case("revoked or unknown key", lambda c, env: httpx.get(
        env["url"] + "/jobs", headers={"Authorization": "Bearer ssk_nope"}), 401,
        "unauthorized", "not valid"),
    Case("unknown job", lambda c, env: c.get("/jobs/" + "0" * 32), 404, "not_found", "job"),
    Case("report of unknown job", lambda c, env: c.get("/jobs/nope/report"), 404, "not_found",
         "job"),
    Case("bad list limit", lambda c, env: c.get("/jobs", params={"limit": 0}), 422,
         "invalid_request", "limit"),
]


@pytest.fixture(scope="module")
def env(redis_service, ckpts) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    svc = redis_service
    with svc.client() as c:
        front = upload(c, ckpts.digits_resnet)
        back = upload(c, ckpts.digits_resnet_b)
    with svc.client(svc.other_key) as c:
        others = upload(c, ckpts.colour_resnet)
    return {"front": front, "back": back, "others": others, "url": svc.url,
            "front_path": ckpts.digits_resnet, "vit": ckpts.digits_vit,
            "marker": ckpts.marker_resnet}


def test_table_has_at_least_twenty_cases() -> None:
    assert len(CASES) >= 20
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case: Case, env: dict[str, Any], redis_service) -> None:  # type: ignore[no-untyped-def]
    svc = redis_service
    before = (svc.store_files(), svc.count_rows("jobs"), svc.count_rows("objects"),
              svc.count_rows("ownership"))
    with svc.client() as c:
        r = case.call(c, env)
    assert r.status_code == case.status, r.text
    err = r.json()["error"]
    assert err["code"] == case.code, err
    assert case.words in err["message"], err["message"]
    assert "Traceback" not in r.text
    after = (svc.store_files(), svc.count_rows("jobs"), svc.count_rows("objects"),
             svc.count_rows("ownership"))
    assert after == before, f"{case.name} left something behind"
