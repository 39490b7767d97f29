"""Job progress in work units (one unit ~ one batch through a network part), and the job's
cancellation point: every stage boundary and every unit of work checks the cancel flag, so a
cancelled job stops within a batch in any stage (preparation, extraction, IRIs, training,
controls), not only where a loop remembers to ask.

Some work has a length known only as it runs: IRIs stop once converged, anywhere between
their first round and their cap (every extra round). The plan counts that work at its cap as
`elastic` units, and the total shown is the best guess of the job's real length: fixed work
plus elastic work times the share of their caps the IRIs took so far (the plan's guess
counting as one span). Work running past the guess grows the total with it, so the bar
never stands at 100 % before the end and never passes it, and the ETA (the rate so far times
what is left, runner.eta_seconds) counts neither unused caps nor skipped work."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from stitchsim_worker.engine.errors import JobCancelled
from stitchsim_worker.engine.resources import CancelFn, ProgressFn

_MIN_INTERVAL_S = 0.5


@dataclass(frozen=True)
class Plan:
    """A job's units: `units` in all, of which `elastic` are spans counted at their cap, which
    are expected to take `expect` of it."""

    units: int
    elastic: int = 0
    expect: float = 1.0

    @property
    def expected(self) -> int:
        """The units the job is expected to take: its elastic part at the expected share."""
        return self.units - self.elastic + round(self.elastic * self.expect)


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
        self._fixed_left = 0  # planned units outside spans, not done yet
        self._elastic_left = 0  # the caps of the spans not started yet
        self._expect = 1.0  # share of a span's cap it is expected to take
        self._used = self._capped = 0  # units finished spans took, and their caps
        self._span: list[int] | None = None  # [cap, used, weight] of the running span

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

    def plan(self, units: int | Plan) -> None:
        self.check_cancel()
        p = units if isinstance(units, Plan) else Plan(units)
        self._fixed_left += p.units - p.elastic
        self._elastic_left += p.elastic
        if p.elastic:
            self._expect = p.expect
        self._retotal()
        self._emit(force=True)

    def enter(self, stage: str) -> None:
        self.check_cancel()
        self._close_stage()
        self.stage = stage
        self._emit(force=True)

    def step(self, units: int = 1) -> None:
        self.check_cancel()
        if self._span is not None:
            units *= self._span[2]
            self._span[1] += units
        else:
            self._fixed_left = max(0, self._fixed_left - units)
        self.done += units
        self._retotal()
        self._emit()

    @contextmanager
    def span(self, cap: int, weight: int = 1) -> Iterator[None]:
        """Work planned at `cap` units (elastic) that stops when it is done; each step inside
        counts `weight` units. When it ends, what it did not use leaves the plan, and what it
        used teaches the guess for the spans still to come (cache hits, using nothing, do not)."""
        if self._span is not None:  # nested: the outer span accounts for it
            yield
            return
        took = min(cap, self._elastic_left)
        self._elastic_left -= took
        self._fixed_left = max(0, self._fixed_left - (cap - took))  # a span the plan had fixed
        self._span = [cap, 0, weight]
        try:
            yield
        finally:
            _, used, _ = self._span
            self._span = None
            if used:
                # The plan's guess counts as one span more: a first shallow stitch point that
                # converged in one round must not make the deeper ones look as quick.
                if not self._capped:
                    self._used, self._capped = round(self._expect * cap), cap
                self._used, self._capped = self._used + used, self._capped + cap
                self._expect = self._used / self._capped
            self._retotal()
            self._emit(force=True)

    def _retotal(self) -> None:
        left = self._fixed_left + round(self._elastic_left * self._expect)
        if self._span is not None:
            cap, used, _ = self._span
            left += max(0, min(cap, round(cap * self._expect)) - used)
        self.total = self.done + left

    def finish(self) -> None:
        self._close_stage()
        self.stage, self.total = "done", self.done
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
