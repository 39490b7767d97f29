"""An HTTP answer checked against the service's own OpenAPI document, generated from the real
app (as tests/service/test_fuzz_openapi.py does): the status must be one the operation
documents, the body must fit the documented schema for that status, and an error's code must
be registered for exactly that status (stitchsim.codes). The fake service's answers go
through this, so a fake that drifts from the service fails the client tests that met it."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from stitchsim import codes

# What a load balancer, reverse proxy or rate limiter in front of the service may answer on
# its own: the client must cope with these too, though the service documents none of them.
PROXY_STATUSES = frozenset({429, 502, 503, 504})


@functools.cache
def openapi() -> dict[str, Any]:
    from stitchsim_service.core.settings import Settings
    from stitchsim_service.gateway.main import create_app

    return create_app(Settings(data_dir=Path("unused"))).openapi()


@functools.cache
def _templates() -> list[tuple[re.Pattern[str], str]]:
    out = []
    for template in openapi()["paths"]:
        pattern = re.escape(template)
        pattern = re.sub(r"\\\{\w+\\\}", "[^/]+", pattern)
        out.append((re.compile(f"^{pattern}$"), template))
    # Literal paths first: /checkpoints before /checkpoints/{checkpoint_id}.
    return sorted(out, key=lambda t: t[1].count("{"))


def operation_of(method: str, path: str) -> tuple[str, dict[str, Any]] | None:
    """(path template, operation) the request goes to, or None when the service has none."""
    bare = path.split("?", 1)[0]
    for pattern, template in _templates():
        if pattern.match(bare):
            op = openapi()["paths"][template].get(method.lower())
            return (template, op) if op is not None else None
    return None


def _validator(schema: dict[str, Any]) -> Draft202012Validator:
    # The document's $refs point at #/components/...: give the schema the document's
    # components so they resolve in place.
    return Draft202012Validator({**schema, "components": openapi()["components"]})


def problems(method: str, path: str, status: int, headers: dict[str, str], body: bytes, *,
             proxy: bool = False) -> list[str]:
    """What is wrong with this answer to METHOD PATH; [] when the service could have given it.
    proxy: the answer stands for one of a proxy in front of the service (PROXY_STATUSES)."""
    where = f"{method} {path} -> {status}"
    if proxy:
        return [] if status in PROXY_STATUSES else [
            f"{where}: a proxy in front of the service answers {sorted(PROXY_STATUSES)}, "
            "not this"]
    found = operation_of(method, path)
    if found is None:
        if status in (404, 405):
            return _error_body_problems(where, status, body)
        return [f"{where}: the service has no such operation, so it answers 404 or 405"]
    template, op = found
    documented = op["responses"].get(str(status))
    if documented is None:
        return [f"{where}: {method} {template} documents {sorted(op['responses'])}, "
                f"not {status}"]
    content = documented.get("content") or {}
    ctype = {k.lower(): v for k, v in headers.items()}.get("content-type", "").split(";")[0]
    if not content:
        return [] if not body else [f"{where}: documented without a body, got {body[:80]!r}"]
    if ctype not in content:
        return [f"{where}: content type {ctype!r}, documented {sorted(content)}"]
    schema = content[ctype].get("schema")
    if ctype != "application/json" or schema is None:
        return []
    try:
        data = json.loads(body)
    except ValueError:
        return [f"{where}: not JSON: {body[:80]!r}"]
    errors = sorted(_validator(schema).iter_errors(data), key=lambda e: list(e.path))
    out = [f"{where}: {'/'.join(map(str, e.path)) or 'body'}: {e.message[:200]}"
           for e in errors[:5]]
    if status >= 400 and not out:
        out += _error_code_problems(where, status, data)
    return out


def _error_body_problems(where: str, status: int, body: bytes) -> list[str]:
    schema = {"$ref": "#/components/schemas/ErrorBody"}
    try:
        data = json.loads(body)
    except ValueError:
        return [f"{where}: an error answer must be the contract's error body"]
    errors = list(_validator(schema).iter_errors(data))
    if errors:
        return [f"{where}: {errors[0].message[:200]}"]
    return _error_code_problems(where, status, data)


def _error_code_problems(where: str, status: int, data: Any) -> list[str]:
    code = data.get("error", {}).get("code") if isinstance(data, dict) else None
    if code is None:
        return []
    entry = codes.get(code)
    if entry is None:
        return [f"{where}: error code {code!r} is not in the registry (stitchsim.codes)"]
    if entry.status != status:
        return [f"{where}: error code {code!r} is registered for HTTP {entry.status}"]
    return []
