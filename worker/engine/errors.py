"""Errors the engine raises on purpose; callers map them to HTTP codes or exit codes."""

from __future__ import annotations

from typing import Any


class SpecError(ValueError):
    """The spec, a checkpoint or a dataset cannot work; the message says what to fix."""

    def __init__(self, message: str, *, code: str = "invalid_spec", details: Any = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.details = details


class JobCancelled(Exception):
    """The job's cancel flag was seen between batches."""
