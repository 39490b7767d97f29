"""What the engine raises besides the contract's Failure (stitchsim.failure): the cancel signal,
the Failure an unexpected exception becomes, and which exceptions pass through as they are (the
interrupts from outside among them)."""

from __future__ import annotations

from typing import Any

from stitchsim.failure import Failure

INTERRUPTS: list[type[BaseException]] = [MemoryError]
"""Exceptions that stop a build from outside (out of memory, the host's time limit: the worker
adds Celery's SoftTimeLimitExceeded) and are never the config's fault: passed on as they are."""


def interrupted(exc: BaseException) -> bool:
    return isinstance(exc, tuple(INTERRUPTS))


class JobCancelled(Exception):
    """The job's cancel flag was seen between batches."""


def engine_failure(where: dict[str, Any], exc: BaseException) -> Failure:
    """An unexpected exception inside the engine as the Failure the user sees: where it
    happened (stage, stitch point, protocol, objective), not the user's fault and not worth
    retrying as it is; the original traceback goes to the log."""
    context = ", ".join(f"{k} {v}" for k, v in where.items() if v and k != "stage")
    place = f"{where.get('stage', 'the job')}" + (f" ({context})" if context else "")
    text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    message = (
        f"the engine failed during {place}: {type(exc).__name__}"
        + (f": {text}" if text else "")
        + "; this is a fault of the service, not of the spec: please report it with the "
        "job id (the traceback is in the worker's log)"
    )
    details = {**{k: v for k, v in where.items() if v}, "error": type(exc).__name__}
    return Failure("engine_error", message, details)


def passes_through(exc: BaseException) -> bool:
    """Exceptions the engine leaves to its caller as they are: failures it raised on purpose
    (the user's mistakes among them), cancellation, memory exhaustion, and what the host
    raised into the engine (a Celery soft time limit arrives as an exception from a signal
    handler)."""
    if isinstance(exc, (Failure, JobCancelled, MemoryError)):
        return True
    name, module = type(exc).__name__, type(exc).__module__
    return name == "OutOfMemoryError" or module.split(".")[0] == "celery"
