"""Pydantic's validation errors, as every part of stitchsim shows them: one formatter.

A refusal by validation (a spec, a request's query, dataset options, a baseline's figures)
says `WHAT: FIELD: PROBLEM; FIELD: PROBLEM (and N more)` and carries every error in its
details as `{field, message, type}`, whether the client found it before sending, the gateway
answered it or `stitchsim-server run` read the spec from a file: the same spec error reads the
same everywhere. Contract: pydantic and the Failure only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from stitchsim.failure import Failure

SHOWN = 5
"""Errors named in a message; details hold them all."""

_NOT_A_FIELD = ("body",)
"""Where FastAPI puts the request's body: every spec field would start with it."""


def field_name(loc: Iterable[Any]) -> str:
    """`train.epochs`, `layers.0.front`; empty for an error of the whole object."""
    return ".".join(str(part) for part in loc if part not in _NOT_A_FIELD)


def _message(error: Mapping[str, Any]) -> str:
    if error.get("type") == "finite_number":  # the form every reader of numbers uses
        return f"is {error.get('input')}: only finite numbers"
    return str(error.get("msg", ""))


def field_errors(errors: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Pydantic's errors (`ValidationError.errors()`) as `{field, message, type}`."""
    return [{"field": field_name(e.get("loc", ())), "message": _message(e),
             "type": str(e.get("type", ""))} for e in errors]


def _joined(field: Mapping[str, str]) -> str:
    if not field["field"]:
        return field["message"]
    return f"{field['field']}{' ' if field['message'].startswith('is ') else ': '}" \
        f"{field['message']}"


def summary(fields: Sequence[Mapping[str, str]], shown: int = SHOWN) -> str:
    """`train.epochs: Input should be ...; protocols.1: ...`: the first `shown`, then how many
    more there are."""
    parts = [_joined(f) for f in fields[:shown]]
    more = f" (and {len(fields) - shown} more)" if len(fields) > shown else ""
    return "; ".join(parts) + more


def validation_message(what: str, fields: Sequence[Mapping[str, str]]) -> str:
    """`invalid spec: train.epochs: Input should be ...`: what was refused, then why."""
    return f"{what}: {summary(fields)}"


def validation_failure(code: str, what: str, errors: Iterable[Mapping[str, Any]]) -> Failure:
    """The Failure for pydantic's errors: the first few in the message, all in details."""
    fields = field_errors(errors)
    return Failure(code, validation_message(what, fields), fields)
