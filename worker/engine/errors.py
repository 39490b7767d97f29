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


class EngineFailure(RuntimeError):
    """An unexpected failure inside the engine, with where it happened (stage, stitch point,
    protocol, objective). Not the user's fault and not worth retrying as it is; the message
    is what the user sees, the original traceback goes to the log."""

    code = "engine_error"

    def __init__(self, message: str, details: dict[str, Any]):
        super().__init__(message)
        self.message = message
        self.details = details

    @classmethod
    def during(cls, where: dict[str, Any], exc: BaseException) -> EngineFailure:
        context = ", ".join(f"{k} {v}" for k, v in where.items() if v and k != "stage")
        place = f"{where.get('stage', 'the job')}" + (f" ({context})" if context else "")
        text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        message = (
            f"the engine failed during {place}: {type(exc).__name__}"
            + (f": {text}" if text else "")
            + "; this is a fault of the service, not of the spec: please report it with the "
            "job id (the traceback is in the worker's log)"
        )
        return cls(message, {**{k: v for k, v in where.items() if v}, "error": type(exc).__name__})


def passes_through(exc: BaseException) -> bool:
    """Exceptions the engine leaves to its caller as they are: the user's mistakes,
    cancellation, memory exhaustion, and what the host raised into the engine (a Celery soft
    time limit arrives as an exception from a signal handler)."""
    if isinstance(exc, (SpecError, JobCancelled, EngineFailure, MemoryError)):
        return True
    name, module = type(exc).__name__, type(exc).__module__
    return name == "OutOfMemoryError" or module.split(".")[0] == "celery"
