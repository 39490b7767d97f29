"""The fake service kept honest: it and a real gateway are asked the same questions, and must
give the same status codes, error codes and headers the client reads; every answer of both
must fit the service's OpenAPI document (openapi_check.py). Without this, a fake that drifted
(DELETE answered 202 for a queued job, any bytes taken as a checkpoint) would let the client
tests pass against a service that does not exist."""

from __future__ import annotations

import json
import pickle
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest

from tests.client.fake_service import FakeService
from tests.client.openapi_check import openapi, problems
from tests.service.helpers import safetensors_bytes


@dataclass
class Answer:
    label: str
    status: int
    code: str | None
    headers: frozenset[str]
    """The headers the client acts on that were present (Location, Retry-After)."""
    problems: list[str]
    body: Any


def _ask(http: httpx.Client, label: str, method: str, path: str, **kw: Any) -> Answer:
    r = http.request(method, path, **kw)
    code = None
    if r.status_code >= 400 and r.headers.get("content-type", "").startswith("application/json"):
        code = r.json().get("error", {}).get("code")
    found = problems(method, r.request.url.raw_path.decode(), r.status_code, dict(r.headers),
                     r.content)
    present = frozenset(h for h in ("location", "retry-after") if h in r.headers)
    json_body = r.json() if r.headers.get("content-type") == "application/json" else None
    return Answer(label, r.status_code, code, present, found, json_body)


def conversation(url: str, key: str) -> list[Answer]:
    """One client's questions, through every route the fake serves, to either service."""
    weights = safetensors_bytes({"w": np.zeros(4, np.float32)},
                                metadata={"arch": "test_resnet", "nonce": uuid.uuid4().hex})
    answers: list[Answer] = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"},
                      timeout=60) as http:
        def ask(label: str, method: str, path: str, **kw: Any) -> Answer:
            answers.append(_ask(http, label, method, path, **kw))
            return answers[-1]

        def upload(label: str, data: bytes) -> Answer:
            return ask(label, "POST", "/checkpoints", files={"file": ("m.safetensors", data)})

        ask("health", "GET", "/healthz")
        ident = upload("upload new bytes", weights).body["id"]
        upload("upload the same bytes again", weights)
        upload("upload text", b"this is not a model, only some text that is long enough")
        upload("upload a pickle", pickle.dumps({"weight": [0.0] * 16}))
        upload("upload an empty file", b"")
        ask("upload without the file field", "POST", "/checkpoints",
            files={"other": ("m.safetensors", weights)})
        ask("a checkpoint by id", "GET", f"/checkpoints/{ident}")
        ask("an unknown checkpoint", "GET", "/checkpoints/sha256:" + "0" * 64)

        spec = {"front": {"checkpoint": ident}, "back": {"checkpoint": ident},
                "layers": [{"front": "layer1", "back": "layer1"}]}
        idem = {"Idempotency-Key": uuid.uuid4().hex}
        job = ask("submit", "POST", "/similarity", json=spec, headers=idem).body["job_id"]
        ask("submit again with the same key", "POST", "/similarity", json=spec, headers=idem)
        ask("the same key for another spec", "POST", "/similarity",
            json={**spec, "threshold": 0.5}, headers=idem)
        ask("submit naming an unknown checkpoint", "POST", "/similarity",
            json={**spec, "back": {"checkpoint": "sha256:" + "1" * 64}})
        ask("job status", "GET", f"/jobs/{job}")
        ask("the report before the end", "GET", f"/jobs/{job}/report")
        ask("the page before the end", "GET", f"/jobs/{job}/report.html")
        ask("the job list", "GET", "/jobs", params={"limit": 5})
        ask("a job list of 0", "GET", "/jobs", params={"limit": 0})
        ask("cancel a queued job", "DELETE", f"/jobs/{job}")
        ask("cancel it again", "DELETE", f"/jobs/{job}")
        ask("the report of a cancelled job", "GET", f"/jobs/{job}/report")
        ask("an unknown job", "GET", "/jobs/" + "0" * 32)
        ask("the page of an unknown job", "GET", "/jobs/" + "0" * 32 + "/report.html")
        ask("no such endpoint", "GET", "/nowhere")
    with httpx.Client(base_url=url, headers={"Authorization": "Bearer ssk_wrong"},
                      timeout=60) as http:
        answers.append(_ask(http, "a wrong key", "GET", "/jobs"))
    return answers


@pytest.fixture(scope="module")
def real_answers(gateway_service: Any) -> list[Answer]:
    return conversation(gateway_service.url, gateway_service.api_key)


def _table(answers: list[Answer]) -> list[tuple[str, int, str | None, frozenset[str]]]:
    return [(a.label, a.status, a.code, a.headers) for a in answers]


def test_the_real_service_answers_as_its_document_says(real_answers: list[Answer]) -> None:
    found = [p for a in real_answers for p in a.problems]
    assert found == [], "\n".join(found)


def test_the_fake_answers_as_the_real_service(real_answers: list[Answer],
                                              fake: FakeService) -> None:
    fake.api_key = "ssk_fake"
    fake.states = [{"state": "queued"}]  # a gateway alone: accepted jobs stay queued
    fake_answers = conversation(fake.url, "ssk_fake")
    assert _table(fake_answers) == _table(real_answers)
    found = [p for a in fake_answers for p in a.problems]
    assert found == [], "\n".join(found)
    # The fake's own record of what it answered agrees (the `fake` fixture also fails on it).
    assert fake.violations == []


# ---------------------------------------------------------------- the check itself

JOB = "0" * 32


@pytest.mark.parametrize(("method", "path", "status", "body", "why"), [
    ("GET", "/healthz", 200, {"ok": True}, "ok: True is not of type 'string'"),
    ("POST", "/checkpoints", 202, {"id": "x", "size": 1, "n_tensors": 1}, "not 202"),
    ("GET", f"/jobs/{JOB}", 200, {"id": JOB, "created_at": "2026-01-01T00:00:00Z"},
     "'state' is a required property"),
    ("GET", f"/jobs/{JOB}/report", 409,
     {"error": {"code": "conflict", "message": "the job has not finished"}},
     None),
    ("POST", "/similarity", 503, {"error": {"code": "too_many_jobs", "message": "m"}},
     "error code 'too_many_jobs' is registered for HTTP 429"),
    ("DELETE", f"/checkpoints/{JOB}", 200, {"id": JOB}, "not 200"),
    ("GET", "/nowhere", 500, {"error": {"code": "internal", "message": "m"}},
     "no such operation"),
])
def test_the_check_finds_answers_the_service_cannot_give(
    method: str, path: str, status: int, body: Any, why: str | None
) -> None:
    found = problems(method, path, status, {"Content-Type": "application/json"},
                     json.dumps(body).encode())
    if why is None:  # a generic code of the right status passes
        assert found == []
    else:
        assert len(found) == 1 and why in found[0], found


def test_proxy_answers_are_only_what_a_proxy_says() -> None:
    assert problems("GET", "/jobs", 502, {}, b"", proxy=True) == []
    assert problems("GET", "/jobs", 200, {}, b"", proxy=True) != []


def test_every_operation_the_sdk_calls_is_in_the_document() -> None:
    paths = openapi()["paths"]
    for method, path in [("post", "/checkpoints"), ("get", "/checkpoints/{checkpoint_id}"),
                         ("post", "/datasets"), ("get", "/datasets"), ("post", "/similarity"),
                         ("get", "/jobs"), ("get", "/jobs/{job_id}"),
                         ("delete", "/jobs/{job_id}"), ("get", "/jobs/{job_id}/report"),
                         ("get", "/jobs/{job_id}/report.html"), ("get", "/usage")]:
        assert method in paths.get(path, {}), (method, path)


def test_every_documented_error_is_the_contract_error_body() -> None:
    # The service answers every error with {"error": {code, message, details}} (its 422s for
    # bad parameters too); a document promising another shape misleads whoever generates a
    # client from it, and would let a fake answer in that shape pass the check above.
    wrong = []
    for path, ops in openapi()["paths"].items():
        for method, op in ops.items():
            for status, answer in op["responses"].items():
                schema = answer.get("content", {}).get("application/json", {}).get("schema")
                if int(status) >= 400 and schema != {"$ref": "#/components/schemas/ErrorBody"}:
                    wrong.append(f"{method.upper()} {path} {status}: {schema}")
    assert wrong == [], "\n".join(wrong)
