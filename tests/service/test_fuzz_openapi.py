"""Property-based fuzzing of every operation in the live service's /openapi.json (schemathesis,
seeded and derandomized, a bounded number of examples per operation and phase).

Whatever is generated, valid or not: never a 5xx, every 4xx carries the contract's error body
with a message and no traceback, no job is started, and nothing is stored but what a 2xx
answer says was stored. Three passes: with a valid key (keys required), without one (then every
non-public operation answers 401), and on the embedded service where keys are optional.
Then hand-made hostile inputs the generator does not make (each was a 500): JSON nested
past the parser or the serializer, ids with a NUL byte (PostgreSQL refuses them), forged
pagination cursors.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig
from stitchsim_service.core.settings import Settings
from stitchsim_service.gateway.main import create_app

from tests.service.helpers import PUBLIC_PATHS, TINY_SPEC, assert_error_body

# Examples per operation in the fuzzing phase (positive and negative modes each); the examples
# and coverage phases add their own fixed, deterministic cases on top.
MAX_EXAMPLES = 20
SEED = 20260601
UPLOAD_PATHS = ("/checkpoints", "/datasets")


def _config(*, security_parameters: bool, coverage: bool) -> SchemathesisConfig:
    return SchemathesisConfig.from_dict({
        "seed": SEED,
        "generation": {
            "max-examples": MAX_EXAMPLES,
            "deterministic": True,
            "database": "none",
            # With a key we send our own; without one, generated (bad) credentials are welcome.
            "with-security-parameters": security_parameters,
        },
        "phases": {"stateful": {"enabled": False}, "coverage": {"enabled": coverage}},
    })


class Ledger:
    """One fuzzed service: the requests made per pass and operation, and what the service may
    have changed (objects that a 201 says were stored; random bytes practically never make a
    valid file, but if they do, storing it is right)."""

    def __init__(self, svc: Any):
        self.svc = svc
        self.files_before = svc.store_files()
        self.jobs_before = svc.count_rows("jobs")
        self.objects_before = svc.count_rows("objects")
        self.stored: set[str] = set()
        self.calls: Counter[tuple[str, str]] = Counter()

    def record(self, fuzz_pass: str, case: Any, response: Any) -> None:
        self.calls[(fuzz_pass, case.operation.label)] += 1
        uploaded = case.method.upper() == "POST" and case.path in UPLOAD_PATHS
        if uploaded and response.status_code == 201:
            self.stored.add(response.json()["id"])

    def operations_called(self, fuzz_pass: str) -> set[str]:
        return {label for (p, label), n in self.calls.items() if p == fuzz_pass and n}

    def assert_nothing_else_changed(self) -> None:
        assert self.svc.count_rows("jobs") == self.jobs_before, "a fuzzed request started a job"
        assert self.svc.count_rows("objects") == self.objects_before + len(self.stored)
        new_files = set(self.svc.store_files()) - set(self.files_before)
        assert not [f for f in new_files if f.startswith("tmp/")], new_files
        assert len(new_files) == len(self.stored), (new_files, self.stored)


@pytest.fixture(scope="module")
def keyed_ledger(redis_service: Any) -> Ledger:
    return Ledger(redis_service)


@pytest.fixture(scope="module")
def local_ledger(live_service: Any) -> Ledger:
    return Ledger(live_service)


def _assert_sound(case: Any, response: Any) -> None:
    where = f"{case.method.upper()} {case.formatted_path}"
    assert response.status_code < 500, f"{where}: {response.status_code} {response.text[:800]}"
    assert not (case.path == "/similarity" and response.status_code == 202), (
        f"{where}: a generated request started a real job")
    if response.status_code >= 400:
        assert_error_body(response)
    operation = OPENAPI["paths"][case.path].get(case.method.lower())
    if operation is None:  # the coverage phase tries methods the path does not have
        assert response.status_code == 405, where
        return
    documented = operation["responses"]
    assert str(response.status_code) in documented, (
        f"{where}: {response.status_code} is not in the published responses {sorted(documented)}")


# The schema is built at import (tests are generated at collection); the first test checks
# that it is exactly what the running services publish.
OPENAPI = create_app(Settings(data_dir=Path("unused"))).openapi()
keyed = schemathesis.openapi.from_dict(
    OPENAPI, config=_config(security_parameters=False, coverage=True))
# Without a key every answer is the same 401 whatever the input, so the coverage phase's
# hundreds of boundary cases would only cost time there.
keyless = schemathesis.openapi.from_dict(
    OPENAPI, config=_config(security_parameters=True, coverage=False))


def test_fuzzed_schema_is_what_the_live_services_publish(redis_service: Any,
                                                          live_service: Any) -> None:
    for svc in (redis_service, live_service):
        live = httpx.get(svc.url + "/openapi.json", timeout=30)
        assert live.status_code == 200
        assert live.json() == OPENAPI
    assert sum(len(ops) for ops in OPENAPI["paths"].values()) >= 15


@keyed.parametrize()
def test_fuzz_with_a_valid_key(case: Any, redis_service: Any, keyed_ledger: Ledger) -> None:
    response = case.call(base_url=redis_service.url, timeout=60,
                         headers={"Authorization": f"Bearer {redis_service.api_key}"})
    _assert_sound(case, response)
    keyed_ledger.record("with key", case, response)


@keyless.parametrize()
def test_fuzz_without_a_key(case: Any, redis_service: Any, keyed_ledger: Ledger) -> None:
    response = case.call(base_url=redis_service.url, timeout=60)
    _assert_sound(case, response)
    same_method = case.method.upper() == case.operation.method.upper()
    if case.path not in PUBLIC_PATHS and same_method:
        # Authentication comes before any validation: nothing about the input leaks.
        assert response.status_code == 401, (case.path, response.status_code, response.text)
    keyed_ledger.record("without key", case, response)


@keyed.parametrize()
def test_fuzz_embedded_without_keys(case: Any, live_service: Any, local_ledger: Ledger) -> None:
    response = case.call(base_url=live_service.url, timeout=60)
    _assert_sound(case, response)
    local_ledger.record("embedded", case, response)


def _nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


# Hostile JSON the generator does not make: nested past the parser's recursion limit, and
# parseable but past what pydantic's serializer and json.dumps take.
DEEP_SPECS = {
    "body past the parser": "[" * 100_000 + "]" * 100_000,
    "arch_kwargs 400 levels": '{"front": {"arch": "resnet18", "arch_kwargs": ' + _nested(400)
                              + "}}",
    "33 levels": _nested(33),
}


@pytest.mark.parametrize("multipart", [False, True], ids=["json body", "multipart spec"])
@pytest.mark.parametrize("text", DEEP_SPECS.values(), ids=DEEP_SPECS.keys())
def test_deeply_nested_specs_are_refused(text: str, multipart: bool, redis_service: Any,
                                         keyed_ledger: Ledger) -> None:
    with redis_service.client() as client:
        if multipart:
            r = client.post("/similarity", data={"spec": text}, files={"front": b""})
        else:
            r = client.post("/similarity", content=text.encode(),
                            headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert "nested more than 32 levels deep" in assert_error_body(r)["message"]


ID_OPERATIONS = sorted((m.upper(), path) for path, ops in OPENAPI["paths"].items() for m in ops
                       if "{" in path)


@pytest.mark.parametrize("method,template", ID_OPERATIONS, ids=[" ".join(o) for o in ID_OPERATIONS])
def test_ids_the_job_table_cannot_hold_are_not_found(method: str, template: str,
                                                     redis_service: Any) -> None:
    # PostgreSQL refuses NUL bytes in text: such an id must not reach it (it was a 500).
    path = re.sub(r"\{\w+\}", "sha256:%00" + "0" * 63, template)
    with redis_service.client() as client:
        r = client.request(method, path)
    assert r.status_code == 404, r.text
    assert assert_error_body(r)["code"] == "not_found"


def _cursor(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


# Hand-made cursors: a NUL byte in the job id and two times that overflow when turned into UTC
# (those three were 500s), a naive time and a job id of another shape (never issued by us).
FORGED_CURSORS = [_cursor("2020-01-01T00:00:00+00:00|" + "0" * 31 + "\x00"),
                  _cursor("9999-12-31T23:59:59-23:59|" + "0" * 32),
                  _cursor("0001-01-01T00:00:00+14:00|" + "0" * 32),
                  _cursor("2020-01-01T00:00:00|" + "0" * 32),
                  _cursor("2020-01-01T00:00:00+00:00|nope")]


@pytest.mark.parametrize("cursor", FORGED_CURSORS)
def test_forged_cursors_are_refused(cursor: str, redis_service: Any) -> None:
    with redis_service.client() as client:
        r = client.get("/jobs", params={"cursor": cursor})
    assert r.status_code == 400, r.text
    assert "cursor is not one this service issued" in assert_error_body(r)["message"]


def test_every_operation_was_fuzzed_and_nothing_was_left(keyed_ledger: Ledger,
                                                         local_ledger: Ledger) -> None:
    operations = {f"{m.upper()} {path}" for path, ops in OPENAPI["paths"].items() for m in ops}
    assert keyed_ledger.operations_called("with key") == operations
    assert keyed_ledger.operations_called("without key") == operations
    assert local_ledger.operations_called("embedded") == operations
    # Bounded: the fuzzing phase stops at MAX_EXAMPLES per mode (operations with few inputs,
    # such as GET /healthz, run out of distinct examples sooner).
    assert sum(keyed_ledger.calls.values()) >= 10 * len(operations)
    for ledger in (keyed_ledger, local_ledger):
        ledger.assert_nothing_else_changed()


PATHS_WITH_METHODS = sorted(OPENAPI["paths"])


@pytest.mark.parametrize("template", PATHS_WITH_METHODS)
def test_a_405_allows_every_method_of_the_path(template: str, redis_service: Any) -> None:
    # Starlette's own 405 listed the methods of the first route whose path matched: POST for
    # /checkpoints, though GET is served there too.
    documented = {m.upper() for m in OPENAPI["paths"][template]}
    path = re.sub(r"\{\w+\}", "sha256:" + "0" * 64, template)
    with redis_service.client() as client:
        r = client.request("PATCH", path)
    assert r.status_code == 405, r.text
    assert set(r.headers["Allow"].split(", ")) == documented, (template, r.headers["Allow"])
    message = assert_error_body(r)["message"]
    assert "PATCH" in message and all(m in message for m in documented), message


def test_metrics_are_documented_as_the_prometheus_text_they_are(redis_service: Any) -> None:
    # It was documented as application/json; a scraper reads text/plain (version=...).
    documented = OPENAPI["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    r = httpx.get(redis_service.url + "/metrics", timeout=30)
    assert r.status_code == 200
    assert list(documented) == [r.headers["content-type"]]
    assert r.headers["content-type"].startswith("text/plain; version=")
    assert "# TYPE stitchsim_http_requests_total counter" in r.text


# ---------------------------------------------------------------- schemathesis as a tester runs it

# Operations whose accepted input the JSON Schema cannot say in full, so schemathesis's
# positive_data_acceptance takes a content refusal (400/415/422) there as an answer: an upload's
# bytes must be a safetensors file; a spec also has rules across fields (iri rounds,
# class_pairing a permutation), ids that must name your own uploads, no local paths, and in a
# multipart form a JSON object inside a text field (400 when the text does not parse).
# Everything else the document allows must be accepted.
CONTENT_CHECKED = r"^/(checkpoints|datasets|similarity)$"
# The same operations' hundreds of negative boundary cases (the spec's above all) are the keyed
# pass's (each refused with an error body, nothing stored, no job started): here only their
# positive ones, to stay within the time.
RUN_CONFIG = f"""
[[operations]]
include-path-regex = '{CONTENT_CHECKED}'
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "404", "409", "415",
                                                     "422", "429"]
phases.coverage.generation.mode = "positive"
"""
# Examples per operation and mode in the fuzzing phase; the coverage phase's boundary cases
# (most of the ~700 requests) and the stateful phase come on top.
RUN_EXAMPLES = 5


def _own_checkpoint(svc: Any, key: str, fill: float) -> str:
    """A small real checkpoint of key's, so reads succeed and the cross-key probes have an
    object to try as the other key."""
    from safetensors.numpy import save

    data = save({"w": np.full((2, 2), fill, np.float32)}, metadata={"arch": "resnet18"})
    r = httpx.post(svc.url + "/checkpoints", files={"file": ("w.safetensors", data)},
                   headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert r.status_code in (200, 201), r.text
    return str(r.json()["id"])


def test_schemathesis_run_with_two_keys_finds_nothing(redis_service: Any, tmp_path: Path) -> None:
    """`schemathesis run` against the live service, with every check it has: server errors,
    status codes, content types, headers (Allow included), response schemas, schema-valid
    input accepted and schema-invalid input refused, missing auth ignored, use after free,
    and, with two keys (alice, bob), bob reading what alice's requests showed her."""
    svc = redis_service
    jobs_before = svc.count_rows("jobs")
    # Under the phases: objects of each key's own (schemathesis may delete them; that is its
    # right). Re-uploading is idempotent, so a rerun in the same session is the same run.
    _own_checkpoint(svc, svc.api_key, 1.0)
    _own_checkpoint(svc, svc.other_key, 2.0)
    auth = tmp_path / "keys.json"
    auth.write_text(json.dumps({"auth": [
        {"name": name, "fixedHeaders": [{"name": "Authorization", "value": f"Bearer {key}"}]}
        for name, key in (("alice", svc.api_key), ("bob", svc.other_key))]}))
    config = tmp_path / "schemathesis.toml"
    config.write_text(RUN_CONFIG)
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run",
           f"{svc.url}/openapi.json", "--auth-wfc", str(auth), "--checks", "all", "--mode", "all",
           "--max-examples", str(RUN_EXAMPLES), "--seed", str(SEED), "--workers", "1",
           "--continue-on-failure", "--no-shrink", "--request-timeout", "60",
           "--report", "json", "--report-json-path", str(report)]
    started = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    took = time.monotonic() - started
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    run = json.loads(report.read_text())
    assert run["complete"] and run["failures"] == [] and run["errors"] == [], run
    assert run["operations"]["tested"] == run["operations"]["total"] == len(
        [op for ops in OPENAPI["paths"].values() for op in ops])
    assert {p: v["status"] for p, v in run["phases"].items() if p != "examples"} == {
        "coverage": "success", "fuzzing": "success", "stateful": "success"}, run["phases"]
    # Only the operations named above may refuse most schema-valid input.
    assert all(re.match(CONTENT_CHECKED, label.split(" ")[1])
               for label in run["warnings"]["validation_mismatch"]), run["warnings"]
    assert run["test_cases"]["generated"] >= 10 * run["operations"]["total"]
    assert svc.count_rows("jobs") == jobs_before, "a generated request started a job"
    assert not [f for f in svc.store_files() if f.startswith("tmp/")]
    print(f"schemathesis: {run['test_cases']['generated']} cases in {took:.0f} s")


# ------------------------------------------------ the document as strict as validation

_ID = "sha256:" + "a" * 64
_SPEC = {**TINY_SPEC, "front": {"checkpoint": _ID}, "back": {"checkpoint": _ID}}
# Each was allowed by the published document and refused by validation (schemathesis's
# positive_data_acceptance found them): the document now refuses each too.
LOOSE_SPECS = {
    "std 0": {"front": {"checkpoint": _ID, "std": [1.0, 0.0, 1.0]}},
    "arch a hub name": {"back": {"checkpoint": _ID, "arch": "hf-hub:org/model"}},
    "noise sigma < 0": {"control_settings": {"noise_sigmas": [-0.1]}},
    "alpha > 1": {"adversarial": {"alphas": [0.0, 2.0]}},
    "alphas repeat": {"adversarial": {"alphas": [1.0, 1.0]}},
    "objectives repeat": {"objectives": ["slm", "slm"]},
    "no layers": {"layers": []},
    "class_pairing repeats": {"class_pairing": [0, 0]},
}


def _against(schema: dict[str, Any]) -> Any:
    import jsonschema

    return jsonschema.Draft202012Validator({**schema, "components": OPENAPI["components"]})


@pytest.mark.parametrize("change", LOOSE_SPECS.values(), ids=LOOSE_SPECS.keys())
def test_the_published_spec_refuses_what_validation_refuses(change: dict[str, Any]) -> None:
    from pydantic import ValidationError
    from stitchsim.models import Spec

    spec = {**_SPEC, **change}
    with pytest.raises(ValidationError):
        Spec.model_validate(spec)
    body = OPENAPI["paths"]["/similarity"]["post"]["requestBody"]["content"]
    assert not _against(body["application/json"]["schema"]).is_valid(spec)
    assert _against(body["application/json"]["schema"]).is_valid(_SPEC)


def _query(path: str, name: str) -> dict[str, Any]:
    return next(p for p in OPENAPI["paths"][path]["get"]["parameters"] if p["name"] == name)


def test_the_published_query_and_forms_refuse_what_validation_refuses() -> None:
    from stitchsim_service.core.jobs import decode_cursor

    points = "/checkpoints/{checkpoint_id}/points"
    for name, bad, good in (("input_size", 4, 224), ("arch", "local-dir:/etc", "resnet18")):
        schema = _against(_query(points, name)["schema"])
        assert not schema.is_valid(bad) and schema.is_valid(good), name
    # arch_kwargs: a JSON object in the query (OpenAPI's content parameter)
    kwargs = _query(points, "arch_kwargs")
    assert _against(kwargs["content"]["application/json"]["schema"]).is_valid({"drop_rate": 0.1})
    assert not _against(kwargs["content"]["application/json"]["schema"]).is_valid(5)
    cursor = _against(_query("/jobs", "cursor")["schema"])
    for bad in ("", *FORGED_CURSORS):
        assert not cursor.is_valid(bad), bad
        with pytest.raises(Exception, match="cursor is not one this service issued"):
            decode_cursor(bad)
    assert cursor.is_valid("1765000000123456-" + "0" * 32)
    decode_cursor("1765000000123456-" + "0" * 32)
    form = OPENAPI["paths"]["/similarity"]["post"]["requestBody"]["content"]
    multipart = _against(form["multipart/form-data"]["schema"])
    assert not multipart.is_valid({"spec": "[1]"}) and not multipart.is_valid({"other": "x"})
    assert multipart.is_valid({"spec": json.dumps({"dataset": "digits"})})
    for upload in ("/checkpoints", "/datasets"):
        form = OPENAPI["paths"][upload]["post"]["requestBody"]["content"]["multipart/form-data"]
        assert not _against(form["schema"]).is_valid({"file": "x", "spec": "{}"}), upload
