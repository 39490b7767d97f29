"""How deep JSON from strangers may nest (arch_kwargs in a checkpoint, specs in a request), and
the one reader of a user's JSON and TOML texts: bounded depth, finite numbers only."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

MAX_JSON_DEPTH = 32
"""Real specs and kwargs are a few levels deep; parsers, pydantic and json.dumps each fail
somewhere beyond a hundred, with an exception of their own."""


def nested_deeper_than(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether a parsed JSON value has objects or arrays nested more than limit levels deep
    (iterative: a hostile value must not exhaust the stack here either)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1)
                         for child in (item.values() if isinstance(item, dict) else item))
    return False


JSON_OBJECT_PATTERN = r"^\{[\s\S]*\}$"
JSON_OBJECT_TEXT: dict[str, Any] = {"contentMediaType": "application/json",
                                    "pattern": JSON_OBJECT_PATTERN}
"""A text field holding a JSON object (arch_kwargs in a query, the spec of a multipart form),
as the OpenAPI document describes it: JSON (contentMediaType), and an object (the pattern, which
generators and validators read where they ignore contentSchema). The gateway refuses text that
does not match the pattern before it parses it, so the two agree."""


def is_json_object_text(text: str) -> bool:
    """Whether text has the shape of JSON_OBJECT_PATTERN (whether it parses is the parser's)."""
    return re.fullmatch(JSON_OBJECT_PATTERN, text) is not None


class JSONInputError(ValueError):
    """A JSON (or TOML) text from a user that is refused, its message naming what to fix."""


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'')
_BRACKET = re.compile(r"[\[\]{}]")


def text_deeper_than(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether brackets outside strings nest more than limit deep in a JSON or TOML text: a
    parser recurses once a level, so a 200,000-deep text must be refused before it is parsed
    (RecursionError is not a ValueError, and a crash is not a message)."""
    depth = 0
    for match in _BRACKET.finditer(_STRING.sub("", text)):
        depth += 1 if match.group() in "[{" else -1
        if depth > limit:
            return True
    return False


def non_finite(value: Any) -> tuple[str, float] | None:
    """The dotted path of the first infinite or NaN number in a parsed value, and the number
    (iterative, as nested_deeper_than)."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return path, item
        if isinstance(item, dict):
            stack.extend((v, f"{path}.{k}" if path else str(k)) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(item))
    return None


def finite_message(field: str, number: float) -> str:
    return f"{field} is {number}: only finite numbers"


def check_parsed(value: Any, what: str) -> Any:
    """value, or JSONInputError saying where it nests too deep or holds inf/NaN."""
    if nested_deeper_than(value):
        raise JSONInputError(f"{what} is nested more than {MAX_JSON_DEPTH} levels deep")
    bad = non_finite(value)
    if bad is not None:  # `iri.converged_below is inf`, or `--set iri.converged_below is inf`
        field, number = bad
        raise JSONInputError(f"{what}: {finite_message(field, number)}" if field
                             else finite_message(what, number))
    return value


def _bounded(text: str, what: str, loads: Callable[[str], Any],
             decode_error: type[Exception], kind: str) -> Any:
    """`loads(text)` with the depth bound checked on the text first (a parser would recurse
    into it) and again as RecursionError, and inf/NaN refused in what it gives."""
    deep = f"{what} is nested more than {MAX_JSON_DEPTH} levels deep"
    if text_deeper_than(text):
        raise JSONInputError(deep)
    try:
        value = loads(text)
    except RecursionError:
        raise JSONInputError(deep) from None
    except decode_error as exc:
        raise JSONInputError(f"{what} is not valid {kind}: {exc}") from None
    return check_parsed(value, what)


def parse_json(text: str | bytes, what: str) -> Any:
    """A user's JSON text parsed, refused with JSONInputError naming `what` (a file, a flag,
    the body) when it is not JSON, nests more than MAX_JSON_DEPTH levels or holds Infinity,
    -Infinity or NaN (Python's reader takes them; standard JSON has none)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return _bounded(text, what, json.loads, ValueError, "JSON")


def parse_toml(text: str, what: str) -> dict[str, Any]:
    """parse_json's bounds for a TOML text (its inf and nan are refused alike)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: config.py made sure tomli is there
        import tomli as tomllib  # type: ignore[no-redef]

    return _bounded(text, what, tomllib.loads, tomllib.TOMLDecodeError,  # type: ignore[no-any-return]
                    "TOML")
