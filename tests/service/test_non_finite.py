"""Issue 49 item 2 against the real gateway: every number field the OpenAPI document publishes,
sent as Infinity, -Infinity or NaN, is a 4xx naming the field, and nothing is stored (the
round's report: `"iri": {"converged_below": Infinity}` was a 202, then a job whose status was
no standard JSON and whose report had null where a number goes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from stitchsim_service.core.settings import Settings
from stitchsim_service.gateway.main import create_app

from tests.service.conftest import tiny_spec

ID = "sha256:" + "a" * 64
WORDS = ("Infinity", "-Infinity", "NaN")
OPENAPI = create_app(Settings(data_dir=Path("unused"))).openapi()


def _numbers(schema: dict[str, Any], path: list[str], seen: tuple[str, ...] = ()
             ) -> list[list[str]]:
    """The paths of the number fields under a schema ("0" for an array's items)."""
    if "$ref" in schema:
        name = schema["$ref"].split("/")[-1]
        if name in seen:
            return []
        return _numbers(OPENAPI["components"]["schemas"][name], path, (*seen, name))
    found = [path] if schema.get("type") == "number" else []
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key, []):
            found += _numbers(sub, path, seen)
    for name, sub in schema.get("properties", {}).items():
        found += _numbers(sub, [*path, name], seen)
    if isinstance(schema.get("items"), dict):
        found += _numbers(schema["items"], [*path, "0"], seen)
    return found


def _fields() -> list[tuple[str, str, list[str]]]:
    """(method, path, field) of every number a request can carry: parameters and bodies."""
    out = []
    for route, ops in OPENAPI["paths"].items():
        for method, op in ops.items():
            for param in op.get("parameters", []):
                out += [(method, route, [f"?{param['name']}"])
                        for _ in _numbers(param.get("schema", {}), [])]
            content = op.get("requestBody", {}).get("content", {})
            schema = content.get("application/json", {}).get("schema", {})
            out += [(method, route, field) for field in _numbers(schema, [])]
    return out


FIELDS = _fields()


def _with(doc: dict[str, Any], field: list[str], marker: str) -> dict[str, Any]:
    """doc with `marker` (a string replaced by the bare word after json.dumps) at field."""
    node: Any = doc
    for i, key in enumerate(field[:-1]):
        nxt = field[i + 1]
        if key not in node or not isinstance(node[key], (dict, list)):
            node[key] = [] if nxt == "0" else {}
        node = node[key]
    last = field[-1]
    if last == "0":
        node[:] = [marker]
    else:
        node[last] = marker
    return doc


def test_the_document_publishes_the_number_fields() -> None:
    names = {".".join(f) for _, _, f in FIELDS}
    print(f"{len(FIELDS)} number fields: {sorted(names)}")
    assert "iri.converged_below" in names and "?wait" in names, names
    assert len(FIELDS) >= 15


@pytest.mark.parametrize("word", WORDS)
def test_every_number_field_refuses_non_finite_values(gateway_service: Any, word: str) -> None:
    before = gateway_service.count_rows("jobs")
    with gateway_service.client() as c:
        for method, route, field in FIELDS:
            if field[0].startswith("?"):
                url = route.replace("{job_id}", "j" * 26)
                r = c.request(method.upper(), url, params={field[0][1:]: word.lower()})
                assert r.status_code == 422, (field, word, r.text)
                continue
            spec = _with(tiny_spec({"checkpoint": ID}, {"checkpoint": ID}), field, "@X@")
            body = json.dumps(spec).replace('"@X@"', word)
            r = c.request(method.upper(), route, content=body,
                          headers={"Content-Type": "application/json"})
            assert 400 <= r.status_code < 500, (field, word, r.status_code, r.text)
            message = r.json()["error"]["message"]
            dotted = ".".join(field).replace(".0", "[0]")
            assert dotted in message and "only finite numbers" in message, (field, message)
    assert gateway_service.count_rows("jobs") == before  # nothing stored
