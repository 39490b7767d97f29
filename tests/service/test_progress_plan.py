"""The progress plan covers IRI extra rounds: planned at their cap before the first step, and
counted down as samples leave short of it, so the total never grows, the ETA falls at a steady
pace, the bar never stands at 100 % while the job still runs and never passes it; the ETA's
rate counts only work done, each kind of work at its own pace.

A real job (in-process, IRIs with extra rounds and early stopping) and the tracker's
arithmetic on its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from stitchsim.models import Spec
from stitchsim_worker.engine.core.progress import PRIOR_SECONDS, Plan, Tracker, Units
from stitchsim_worker.engine.iri.synthesis import round_lengths

from tests.service.conftest import tiny_spec


def test_spans_are_counted_at_their_cap_and_count_down() -> None:
    """Issue 48: the total is known before the first step and never grows; samples that
    leave give their steps back as they leave, a span's unused rest at its end."""
    seen: list[tuple[int, int]] = []
    t = Tracker(lambda _s, done, total, _eta: seen.append((done, total)), None)
    # 40 fixed units and two IRI spans capped at 30 each; the budget's guess of a quarter
    # does not enter the bar.
    t.plan(Plan(Units(forward=40, iri=60), expect=0.25))
    assert (t.done, t.total) == (0, 100)
    with t.span(30, weight=3):
        for _ in range(5):  # 15 units: the total stays
            t.step()
            assert t.total == 100
        t.skip(2)  # two sample-steps of the cap given back: 6 units
        assert (t.done, t.total) == (15, 94)
    # 15 used and 6 given back of its 30: the other 9 leave at its end.
    assert (t.done, t.total) == (15, 85)
    for _ in range(10):
        t.step()
    with t.span(30, weight=3):  # a cache hit: all of it given back
        pass
    assert (t.done, t.total) == (25, 55)
    t.finish()
    assert seen[-1] == (25, 25)
    assert all(d <= tot for d, tot in seen)
    totals = [tot for _d, tot in seen]
    assert totals == sorted(totals, reverse=True), totals


# Distances never fall below 1e-6: every batch runs all its extra rounds.
@pytest.mark.parametrize(("rounds", "cap"), [
    # The paper method's extra rounds have their own length (100): null takes the first
    # round's times the growth.
    ({"steps": 4, "cycle_steps": 4, "extra_rounds": 2, "extra_round_growth": 2,
      "extra_round_steps": None}, 4 + 8 + 16),
    # A cap past the 100 steps a set is expected to take (plan.IRI_STEPS_EXPECTED), run to
    # its end: the bar that counted the guess grew here.
    ({"steps": 1, "cycle_steps": 1, "extra_rounds": 2, "extra_round_growth": 1,
      "extra_round_steps": 50}, 1 + 50 + 50),
], ids=["growing-rounds", "past-the-guess"])
def test_iri_extra_rounds_move_the_bar_to_the_end(ckpts: Any, tmp_path: Path,
                                                   rounds: dict[str, Any], cap: int) -> None:
    from stitchsim_worker.engine import Resources, run_job

    path = {"checkpoint": {"path": str(ckpts.digits_resnet)}}
    iri = {**rounds, "stop_below": None, "converged_below": 1e-6, "batch_size": 64}
    spec = Spec.model_validate(tiny_spec(path, path, protocols=["invariance_aware"], iri=iri,
                                         train={"epochs": 1, "max_train_samples": 128,
                                                "max_test_samples": 64, "seed": 0}))
    assert sum(round_lengths(spec.iri)) == cap
    calls: list[tuple[str, int, int]] = []
    report = run_job(spec, resources=Resources(cache_dir=tmp_path),
                     progress=lambda stage, done, total, _eta: calls.append((stage, done, total)))
    assert report.results
    iri_calls = [(d, t) for s, d, t in calls if s.startswith("iri")]
    assert iri_calls and all(d < t for d, t in iri_calls), iri_calls
    assert all(d <= t for _, d, t in calls)
    # Known before the first step, at the cap: never grows (issue 48).
    totals = [t for _s, _d, t in calls if t]
    assert totals == sorted(totals, reverse=True), totals
    # Only the end stands at 100 %.
    assert [s for s, d, t in calls if t and d == t] == ["done"], calls[-5:]


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_each_kind_of_work_is_timed_at_its_own_pace() -> None:
    clock, etas = _Clock(), []
    t = Tracker(lambda _s, _d, _t, eta: etas.append(eta), None, clock=clock)
    t.plan(Plan(Units(forward=10, train=40)))
    t.enter("prepare")
    clock.now += 5.0  # the warm-up: slow, and not taken as the pace
    t.step()
    t.enter("stitch a")
    for _ in range(4):  # a batch through both models: 1 s
        clock.now += 1.0
        t.step()
    # Training not seen yet: at its prior share of the pace seen (PRIOR_SECONDS).
    assert t.eta_s() == 5 * 1.0 + 40 * PRIOR_SECONDS["train"] / PRIOR_SECONDS["forward"]
    t.enter("train a")
    for _ in range(20):  # a training step: 0.1 s, whatever extraction cost
        clock.now += 0.1
        t.step(kind="train")
    assert t.eta_s() == 5 * 1.0 + 20 * 0.1
    t.finish()
    assert etas[-1] == 0.0


def test_at_a_steady_pace_the_eta_only_falls() -> None:
    """An IRI set that stops early and one that needs its extra rounds, at one second a unit:
    the ETA counts the caps down and never rises (issue 48: it used to add each extra round
    as it came, from 12 s back to 1m42s)."""
    clock, etas = _Clock(), []
    t = Tracker(lambda _s, _d, _t, eta: etas.append(eta), None, clock=clock)
    # Two IRI sets capped at 70 units each, in rounds of 10.
    t.plan(Plan(Units(iri=140), expect=0.4))
    t.enter("iri a")
    with t.span(70, weight=1):
        for _ in range(20):  # two rounds, then converged: the rest given back
            clock.now += 1.0
            t.step()
        t.skip(50)
    assert t.total == 20 + 70
    t.enter("iri b")
    with t.span(70, weight=1):
        for n in range(70):  # every round; half the samples leave after the third
            clock.now += 1.0 if n < 30 else 0.5
            t.step(1 if n < 30 else 0.5)
            if n == 29:
                t.skip(20)
    t.finish()
    known = [e for e in etas if e is not None]
    assert known[0] >= 100 and known[-1] == 0.0
    assert all(b <= a for a, b in zip(known, known[1:], strict=False)), known


def test_an_eta_learning_a_slower_pace_is_held_not_raised() -> None:
    """A deeper IRI point costs more a step: the second set runs at twice the first's pace.
    The estimate rises when the tracker learns it; the ETA shown is held at the last one less
    the time since, so it only falls while the hold lasts (issue 48: 56m36s -> 57m51s in the
    demo's seeds check)."""
    clock, etas = _Clock(), []
    t = Tracker(lambda _s, _d, _t, eta: etas.append(eta), None, clock=clock)
    t.plan(Plan(Units(iri=200), expect=0.5))
    raw: list[float] = []
    for pace, name in ((1.0, "iri a"), (2.0, "iri b")):
        t.enter(name)
        with t.span(100, weight=1):
            for _ in range(30):
                clock.now += pace
                t.step()
                raw.append(t.eta_s() or 0.0)
            t.skip(70)
    t.finish()
    assert max(b - a for a, b in zip(raw, raw[1:], strict=False)) > 10  # the estimate rose
    known = [e for e in etas if e is not None]
    assert known[0] >= 100 and known[-1] == 0.0
    assert all(b <= a for a, b in zip(known, known[1:], strict=False)), known


def test_each_step_is_held_to_its_own_count() -> None:
    """The runner runs the job's step list under each step's stage and compares what each
    step's batches reported with the units it counted, kind by kind: the count and the run are
    one list, so a wrong count names its step (IRIs may stop short of their cap)."""
    from typing import cast

    from stitchsim_worker.engine.core.step import JobRun, Step, plan_of, run_steps

    stages: list[str] = []
    t = Tracker(lambda stage, _d, _t, _e: stages.append(stage), None)

    def batches(n: int, kind: Any = "forward") -> Any:
        return lambda _job: [t.step(1, kind) for _ in range(n)]

    def iris(_job: Any) -> None:
        with t.span(30, weight=3):
            for _ in range(4):  # stopped at 12 of its 30
                t.step()

    steps = [Step("prepare", Units(forward=2), batches(2)),
             Step("stitch a", Units(forward=1, train=3), lambda j: (batches(1)(j),
                                                                   batches(3, "train")(j))),
             Step("iri a", Units(iri=30), iris),
             Step("measures a", Units(measure=5), batches(4, "measure"))]
    t.enter("prepare")
    t.plan(plan_of(steps, expect=1.0))
    reported = run_steps(steps, cast(JobRun, None), t)
    assert [r.mismatch() for r in reported] == [
        None, None, None, "measures a: reported measure 4 of 5 planned"]
    # Each step entered once, the first going on in the stage the job opened with.
    assert [s for n, s in enumerate(stages) if s != stages[n - 1] or n == 0] == [
        "prepare", "stitch a", "iri a", "measures a"]
    assert t.done == 2 + 4 + 12 + 4
