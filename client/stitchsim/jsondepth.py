"""How deep JSON from strangers may nest (arch_kwargs in a checkpoint, specs in a request)."""

from __future__ import annotations

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
