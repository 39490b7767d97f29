"""Job progress in work units (one unit ~ one batch through a network part), and the job's
cancellation point: every stage boundary and every unit of work checks the cancel flag, so a
cancelled job stops within a batch in any stage (preparation, extraction, IRIs, training,
controls), not only where a loop remembers to ask."""

from __future__ import annotations

import time

from stitchsim_worker.engine.errors import JobCancelled
from stitchsim_worker.engine.resources import CancelFn, ProgressFn

_MIN_INTERVAL_S = 0.5


class Tracker:
    def __init__(self, fn: ProgressFn | None, should_cancel: CancelFn | None):
        self._fn = fn
        self.should_cancel: CancelFn = should_cancel or (lambda: False)
        self.stage = "starting"
        self.done = 0
        self.total = 0
        self._last = 0.0
        self.timings: dict[str, float] = {}
        self._stage_started = time.perf_counter()
        self._focus: dict[str, str | None] = {}

    def focus(self, **details: str | None) -> None:
        """What the job is working on inside the stage (stitch point, protocol, objective):
        named in the error if the engine fails."""
        self._focus.update(details)

    def where(self) -> dict[str, str | None]:
        return {"stage": self.stage, **self._focus}

    def check_cancel(self) -> None:
        """Raises JobCancelled once the job's cancel flag is up."""
        if self.should_cancel():
            raise JobCancelled()

    def plan(self, units: int) -> None:
        self.check_cancel()
        self.total += units
        self._emit(force=True)

    def enter(self, stage: str) -> None:
        self.check_cancel()
        self._close_stage()
        self.stage = stage
        self._emit(force=True)

    def step(self, units: int = 1) -> None:
        self.check_cancel()
        self.done = min(self.total, self.done + units)
        self._emit()

    def finish(self) -> None:
        self._close_stage()
        self.stage, self.done = "done", self.total
        self._emit(force=True)

    def _close_stage(self) -> None:
        now = time.perf_counter()
        kind = self.stage.split(" ")[0]
        self.timings[kind] = self.timings.get(kind, 0.0) + now - self._stage_started
        self._stage_started = now

    def _emit(self, force: bool = False) -> None:
        now = time.monotonic()
        if self._fn is not None and (force or now - self._last >= _MIN_INTERVAL_S):
            self._last = now
            self._fn(self.stage, self.done, self.total)
