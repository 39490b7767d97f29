"""The one failure type: a code of the error-code registry (stitchsim.codes), a message that
says what to fix, and details for programs.

The engine raises it, the spec-check task and the runner pass it on (over Celery as its dict),
the job table stores its three fields, the gateway answers with it (the registry gives the
status), and the client raises it again: every exception of the SDK is a Failure (the
service's answers, the Failure a job ended with, and what the client finds itself, each with
its code). Standard library only, so every process can import it for nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stitchsim import codes


class Failure(Exception):
    def __init__(self, code: str, message: str, details: Any = None, *,
                 retry_after: float | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details
        self.retry_after = retry_after
        """Seconds after which the same request may succeed (quotas, outages)."""

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code!r}, {self.message!r})"

    def line(self) -> str:
        """`MESSAGE (CODE)`: the failure in one line, as the CLI prints every one (and as the
        client's exceptions read): what to fix, then the code to look up in the registry."""
        return f"{self.message} ({self.code})"

    @property
    def entry(self) -> codes.Code | None:
        """The code's registry entry; None for a code this version does not know (a newer
        service's, or a proxy's)."""
        return codes.get(self.code)

    def as_dict(self) -> dict[str, Any]:
        """The three fields, as the error body, the job table and the check task carry them."""
        return {"code": self.code, "message": self.message, "details": self.details}

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any]) -> Failure:
        return cls(str(fields.get("code") or "internal"), str(fields.get("message") or ""),
                   fields.get("details"))
