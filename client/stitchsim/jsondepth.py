"""How deep JSON from strangers may nest (arch_kwargs in a checkpoint, specs in a request)."""

from __future__ import annotations

import re
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
