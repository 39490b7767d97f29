"""Job progress in work units (one unit ~ one batch through a network part), the job's ETA,
and its cancellation point: every stage boundary and every unit of work checks the cancel
flag, so a cancelled job stops within a batch in any stage (preparation, extraction, IRIs,
training, controls), not only where a loop remembers to ask.

Units come in kinds (`Kind`) whose batches take different times: a training step of the
stitch runs 3-4x faster than a batch of 256 through both models (bench/eta_accuracy.py). The
ETA is each kind's units left times that kind's own rate in this job, so a job that starts
with extraction does not read its training at extraction's pace.

Some work has a length known only as it runs: IRIs stop once converged, anywhere between
their first round and their cap (every extra round). The plan counts that work at its cap as
the elastic kind, and the bar counts it down: samples that leave a set short of the cap (they
converged, or their batch's rounds ended) give back the steps they will not take as they
leave. So the total is known before the first step and never grows, and the ETA only falls at
a steady pace (issue 48: an ETA that counted a guess and added each extra round as it came
jumped from 12 s back to 1m42s). The price: until the IRIs stop, the ETA is that of their cap
(an upper bound; the budget's `expected` share is the guess, Plan.expected)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from stitchsim_worker.engine.core.errors import JobCancelled
from stitchsim_worker.engine.core.resources import CancelFn, ProgressFn

_MIN_INTERVAL_S = 0.5

Kind = Literal["forward", "train", "augment", "attack", "measure", "iri"]
KINDS: tuple[Kind, ...] = ("forward", "train", "augment", "attack", "measure", "iri")
ELASTIC: Kind = "iri"

PRIOR_SECONDS: dict[Kind, float] = {
    "forward": 1.0, "train": 0.6, "augment": 1.0, "attack": 3.5, "measure": 0.1, "iri": 1.4}
"""Each kind's time per unit relative to the others, for the ETA before the job has run a
kind itself (measured on test_resnet jobs, bench/eta_accuracy.py `by kind of unit`): a
training batch of 128 through g>j and back costs about half a batch of 256 through both
models (0.4-0.9), an IRI unit about 1.4 of one, PGD steps on a test batch ("attack") 3.5,
on the attacked share of a training batch ("augment") about 1, a measure's mini-batch a
tenth."""

_WARM_UP = "prepare"
"""The stage whose units carry the first batches' warm-up (4-8x slower per unit): they do
not teach the rates."""


class Units:
    """Work of some part of a job, by kind; the elastic kind (IRIs) at its cap."""

    __slots__ = ("by_kind",)

    def __init__(self, **by_kind: float) -> None:
        unknown = set(by_kind) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown kinds of work: {sorted(unknown)}")
        self.by_kind: dict[str, float] = {k: v for k, v in by_kind.items() if v}

    def __add__(self, other: Units) -> Units:
        merged = dict(self.by_kind)
        for k, v in other.by_kind.items():
            merged[k] = merged.get(k, 0) + v
        return Units(**merged)

    def __sub__(self, other: Units) -> Units:
        return self + other * -1

    def __mul__(self, factor: float) -> Units:
        return Units(**{k: v * factor for k, v in self.by_kind.items()})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Units) and self.by_kind == other.by_kind

    def __repr__(self) -> str:
        return f"Units({', '.join(f'{k}={v:g}' for k, v in self.by_kind.items())})"

    @property
    def total(self) -> int:
        return round(sum(self.by_kind.values()))

    @property
    def elastic(self) -> int:
        return round(self.by_kind.get(ELASTIC, 0))


R = TypeVar("R")


@dataclass(frozen=True)
class Work(Generic[R]):
    """A piece of work and the units it takes, made together by one function from the sizes
    it runs on: the plan reads `units`, the step calls `run`, and no second function restates
    the count (test_progress_accounting holds each report to it)."""

    units: Units
    run: R


@dataclass(frozen=True)
class Plan:
    """A job's work, of which the elastic units are spans counted at their cap, expected to
    take `expect` of it."""

    work: Units
    expect: float = 1.0

    @property
    def units(self) -> int:
        return self.work.total

    @property
    def elastic(self) -> int:
        return self.work.elastic

    @property
    def expected(self) -> int:
        """The units the job is expected to take: its elastic part at the expected share."""
        return self.units - self.elastic + round(self.elastic * self.expect)


@dataclass
class _Span:
    cap: float
    weight: float
    used: float = 0.0
    skipped: float = 0.0  # the units of the cap it will not take
    seconds: float = 0.0  # the time its steps took

    def rate(self) -> float | None:
        """Its seconds per unit, once it has run long enough to tell."""
        return self.seconds / self.used if self.used >= 1 and self.seconds >= 0.5 else None

    @property
    def left(self) -> float:
        return max(0.0, self.cap - self.used - self.skipped)


class Tracker:
    def __init__(self, fn: ProgressFn | None, should_cancel: CancelFn | None,
                 clock: Callable[[], float] = time.monotonic):
        self._fn = fn
        self._clock = clock
        self.should_cancel: CancelFn = should_cancel or (lambda: False)
        self.stage = "starting"
        self.done = 0
        self._done = 0.0  # done, with the fractions of steps over part of a batch
        self._reported: dict[str, float] = {}  # the same, by kind
        self.total = 0
        self._last = 0.0
        self.timings: dict[str, float] = {}
        self._stage_started = time.perf_counter()
        self._focus: dict[str, str | None] = {}
        self._left: dict[str, float] = {}  # planned fixed units not done yet, by kind
        self._elastic_left = 0.0  # the caps of the spans not started yet
        self._span: _Span | None = None
        self._last_span_rate: float | None = None
        self._seconds: dict[str, float] = {}  # time each kind took, past the warm-up
        self._units: dict[str, float] = {}  # and its units
        self._last_step = clock()
        self._shown_eta: tuple[float, float] | None = None  # (eta, when) last emitted

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

    def plan(self, plan: Plan) -> None:
        self.check_cancel()
        for kind, units in plan.work.by_kind.items():
            if kind != ELASTIC:
                self._left[kind] = self._left.get(kind, 0) + units
        if plan.elastic:  # at the cap, not plan.expect: a total that never grows
            self._elastic_left += plan.work.by_kind[ELASTIC]
        self._retotal()
        self._emit(force=True)

    def enter(self, stage: str) -> None:
        self.check_cancel()
        self._close_stage()
        self.stage = stage
        self._emit(force=True)

    @property
    def reported(self) -> Units:
        """Units reported so far by kind, with the fractions of steps over part of a batch:
        what each step of the job is held to (step.run_steps)."""
        return Units(**self._reported)

    def counter(self, kind: Kind) -> Callable[[float], None]:
        """step() for units of one kind, for loops that take a callback."""
        return lambda units=1: self.step(units, kind)

    def step(self, units: float = 1, kind: Kind = "forward") -> None:
        self.check_cancel()
        now = self._clock()
        if self._span is not None:
            kind = ELASTIC
            units *= self._span.weight
            self._span.used += units
        else:
            self._left[kind] = max(0.0, self._left.get(kind, 0) - units)
        if self.stage != _WARM_UP:
            self._seconds[kind] = self._seconds.get(kind, 0.0) + now - self._last_step
            self._units[kind] = self._units.get(kind, 0.0) + units
            if self._span is not None:
                self._span.seconds += now - self._last_step
        self._last_step = now
        self._reported[kind] = self._reported.get(kind, 0.0) + units
        self._done += units
        self.done = round(self._done)
        self._retotal()
        self._emit()

    @contextmanager
    def span(self, cap: int, weight: float = 1) -> Iterator[None]:
        """Elastic work planned at `cap` units that stops when it is done; each step inside
        counts `weight` units (a fraction when steps are of the samples still live), and so
        does each step given back (skip). When it ends, what it did not use leaves the plan
        (a cache hit, using nothing, gives back all of it)."""
        if self._span is not None:  # nested: the outer span accounts for it
            yield
            return
        took = min(cap, self._elastic_left)
        self._elastic_left -= took
        if cap > took:  # a span the plan had counted as fixed work
            self._left["forward"] = max(0.0, self._left.get("forward", 0) - (cap - took))
        self._span = _Span(cap, weight)
        try:
            yield
        finally:
            self._last_span_rate = self._span.rate() or self._last_span_rate
            self._span = None
            self._last_step = self._clock()
            self._retotal()
            self._emit(force=True)

    def skip(self, steps: float) -> None:
        """Steps of the running span's cap that will not be taken (samples that left short
        of it): the total falls by them now, not at the span's end."""
        if self._span is None or steps <= 0:
            return
        self._span.skipped += steps * self._span.weight
        self._retotal()
        self._emit()

    def _left_by_kind(self) -> dict[str, float]:
        left = {k: v for k, v in self._left.items() if v > 0}
        elastic = self._elastic_left + (self._span.left if self._span is not None else 0.0)
        if elastic > 0:
            left[ELASTIC] = elastic
        return left

    def _retotal(self) -> None:
        # Rounded once, from the unrounded work done: rounding each part apart would make
        # the total wobble by a unit as fractions of steps add up.
        self.total = round(self._done + sum(self._left_by_kind().values()))

    def eta_s(self) -> float | None:
        """Seconds left: each kind's units left at its rate in this job so far; a kind not
        run yet at the rate of those that ran, scaled by PRIOR_SECONDS."""
        if self.stage == "done":
            return 0.0
        seen = {k: self._seconds[k] / u for k, u in self._units.items() if u > 0}
        if not seen:
            return None
        # IRIs run shallow stitch points first and a deeper front part costs more a step: the
        # latest set's pace, not the average, is the one the sets to come will keep.
        latest = (self._span.rate() if self._span is not None else None) or self._last_span_rate
        if latest is not None:
            seen[ELASTIC] = latest
        # One second of prior-weighted work at this job's pace, from every kind seen.
        pace = sum(self._seconds.values()) / sum(
            u * PRIOR_SECONDS[k] for k, u in self._units.items())  # type: ignore[index]
        return round(sum(units * seen.get(k, pace * PRIOR_SECONDS[k])  # type: ignore[index]
                         for k, units in self._left_by_kind().items()), 1)

    def unit_seconds(self) -> dict[str, float]:
        """Each kind's seconds per unit in this job (past the warm-up): what PRIOR_SECONDS and
        the operator's seconds-per-unit setting are calibrated from."""
        return {k: round(self._seconds[k] / u, 5) for k, u in self._units.items() if u > 0}

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
        now = self._clock()
        if self._fn is not None and (force or now - self._last >= _MIN_INTERVAL_S):
            self._last = now
            self._fn(self.stage, self.done, self.total, self._falling_eta(now))

    def _falling_eta(self, now: float) -> float | None:
        """The ETA shown: the estimate, held at the last one shown less the time since when
        it would rise. The total counts IRIs at their cap, so the estimate is an upper bound
        and a rise is the pace of a deeper point being learnt, not more work; a newcomer reads
        an ETA that jumps back as a defect. Once the hold runs out (the job slower than every
        estimate so far) the estimate is shown as it is."""
        eta = self.eta_s() if self.total else None
        if eta is None:
            return None
        if self._shown_eta is not None:
            shown, at = self._shown_eta
            held = shown - (now - at)
            if eta > held > 0:
                eta = round(held, 1)
        self._shown_eta = (eta, now)
        return eta
