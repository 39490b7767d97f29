"""A job's progress on a terminal: a bar redrawn in place, or plain lines in CI logs. The CLI
shows it while it waits; `Job.wait(progress=True)` does too."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from typing import IO, Literal

from stitchsim.models import JobStatus


class ProgressPrinter:
    """Shows a job's progress: a bar redrawn in place on a terminal, plain lines in CI logs.

    Lines are printed on every change of state; while running, at most one per
    `min_interval` seconds when the stage or the tenth of the work done changed, and one per
    `heartbeat` seconds regardless, so a log shows the job is alive without flooding.
    """

    def __init__(
        self,
        stream: IO[str] | None = None,
        *,
        job_id: str = "",
        mode: Literal["auto", "bar", "lines"] = "auto",
        min_interval: float = 10.0,
        heartbeat: float = 30.0,
        width: int = 24,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.stream = stream or sys.stderr
        self.clock = clock
        if mode == "auto":
            isatty = getattr(self.stream, "isatty", lambda: False)
            mode = "bar" if isatty() and os.environ.get("TERM") != "dumb" else "lines"
        self.mode = mode
        # The full id is logged at submission; eight hex digits identify it in a log.
        self.label = f"job {job_id[:8]}" if job_id else "job"
        self.min_interval = min_interval
        self.heartbeat = heartbeat
        self.width = width
        self._start = clock()
        self._last: tuple[str, str, int] | None = None
        self._last_time = 0.0
        self._drawn = False

    def __call__(self, status: JobStatus) -> None:
        if self.mode == "bar":
            self._draw_bar(status)
        else:
            self._print_line(status)

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False

    def _describe(self, status: JobStatus) -> tuple[list[str], float | None]:
        p = status.progress
        running = status.state == "running"
        frac = min(1.0, p.done / p.total) if running and p.total > 0 else None
        parts = [p.stage if running else status.state]
        if frac is not None:
            parts.append(f"{p.done}/{p.total}")
        # An ETA of 0 with work left means "not estimated yet" (a stage just began).
        if running and p.eta_s is not None and (p.eta_s > 0 or p.done >= p.total):
            parts.append(f"eta {_duration(p.eta_s) if p.eta_s >= 0.5 else '<1s'}")
        parts.append(f"elapsed {_duration(self.clock() - self._start)}")
        return parts, frac

    def _draw_bar(self, status: JobStatus) -> None:
        parts, frac = self._describe(status)
        if status.state == "succeeded":
            frac = 1.0
        filled = round((frac or 0.0) * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        pct = f"{frac:4.0%}" if frac is not None else "    "
        line = f"[{bar}] {pct}  {'  '.join(parts)}"
        # A line longer than the terminal wraps, and \r then redraws only its last row.
        columns = shutil.get_terminal_size().columns
        if len(line) >= columns:
            line = line[: max(columns - 2, 10)] + "…"
        self.stream.write(f"\r\x1b[K{line}")
        self.stream.flush()
        self._drawn = True

    def _print_line(self, status: JobStatus) -> None:
        parts, frac = self._describe(status)
        key = (status.state, status.progress.stage, -1 if frac is None else int(frac * 10))
        now = self.clock()
        new_state = self._last is None or key[0] != self._last[0]
        since = now - self._last_time
        quiet = since < self.min_interval or (key == self._last and since < self.heartbeat)
        if quiet and not new_state:
            return
        self._last, self._last_time = key, now
        if frac is not None:
            parts[1] += f" ({frac:.0%})"
        self.stream.write(f"stitchsim: {self.label}: {', '.join(parts)}\n")
        self.stream.flush()


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
