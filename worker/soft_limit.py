"""Whether Celery's soft time limit fired while a task ran.

The soft limit arrives as SoftTimeLimitExceeded raised from a signal handler (billiard's, on
SIGUSR1), wherever the task happens to be. Code that catches broad exceptions can swallow it
and fail later with an error of its own: torch.fx's tracer, interrupted in a module's forward,
fails with "NameError: module is not installed as a submodule". The exception is then no
witness that time ran out; the signal is. `watched()` wraps the pool's handler so the task
knows that it fired, whatever came of the exception.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

SOFT_LIMIT_SIGNAL = getattr(signal, "SIGUSR1", None)


class Fired:
    """Set once the soft limit's signal came in while watched."""

    def __init__(self) -> None:
        self.is_set = False


@contextlib.contextmanager
def watched() -> Iterator[Fired]:
    """Record the soft limit's signal and pass it on to the pool's own handler. Outside the
    main thread (where no signal handler can be set) nothing is recorded."""
    fired = Fired()
    if SOFT_LIMIT_SIGNAL is None or threading.current_thread() is not threading.main_thread():
        yield fired
        return
    previous = signal.getsignal(SOFT_LIMIT_SIGNAL)
    if not callable(previous):  # SIG_DFL or SIG_IGN: not a pool process with a soft limit
        yield fired
        return

    def record(signum: int, frame: FrameType | None) -> Any:
        fired.is_set = True
        return previous(signum, frame)

    signal.signal(SOFT_LIMIT_SIGNAL, record)
    try:
        yield fired
    finally:
        signal.signal(SOFT_LIMIT_SIGNAL, previous)
