"""The progress plan covers IRI extra rounds: planned at their cap, steps beyond a span's plan
grow it, and what a span did not need leaves the plan, so the bar never stands at 100 % while
the job still runs and never passes it; the ETA's rate counts only work done, each kind of
work at its own pace.

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


def test_spans_give_back_unused_work_and_grow_past_their_plan() -> None:
    seen: list[tuple[int, int]] = []
    t = Tracker(lambda _s, done, total, _eta: seen.append((done, total)), None)
    # 40 fixed units and two IRI spans capped at 30 each, expected to take a quarter of it.
    t.plan(Plan(Units(forward=40, iri=60), expect=0.25))
    assert (t.done, t.total) == (0, 40 + 15)
    with t.span(30, weight=3):
        for _ in range(5):  # 15 units, past the 7.5 expected: the total grows with them
            t.step()
            assert t.done < t.total
    # Half the cap used; with the plan's guess as one more span, (7.5 + 15) / 60 of the next
    # span's cap is expected: 11.25 units.
    assert (t.done, t.total) == (15, 15 + 40 + 11)
    for _ in range(10):
        t.step()
    with t.span(30, weight=3):  # a cache hit: nothing used, nothing learnt
        pass
    assert (t.done, t.total) == (25, 25 + 30)
    t.finish()
    assert seen[-1] == (25, 25)
    assert all(d <= tot for d, tot in seen)


def test_iri_extra_rounds_move_the_bar_to_the_end(ckpts: Any, tmp_path: Path) -> None:
    from stitchsim_worker.engine import Resources, run_job

    path = {"checkpoint": {"path": str(ckpts.digits_resnet)}}
    # Distances never fall below 1e-6: every batch runs all its extra rounds.
    # The paper method's extra rounds have their own length (100): null takes the first
    # round's times the growth.
    iri = {"steps": 4, "cycle_steps": 4, "extra_rounds": 2, "extra_round_growth": 2,
           "extra_round_steps": None, "stop_below": None, "converged_below": 1e-6,
           "batch_size": 64}
    spec = Spec.model_validate(tiny_spec(path, path, protocols=["invariance_aware"], iri=iri,
                                         train={"epochs": 1, "max_train_samples": 128,
                                                "max_test_samples": 64, "seed": 0}))
    assert sum(round_lengths(spec.iri)) == 4 + 8 + 16
    calls: list[tuple[str, int, int]] = []
    report = run_job(spec, resources=Resources(cache_dir=tmp_path),
                     progress=lambda stage, done, total, _eta: calls.append((stage, done, total)))
    assert report.results
    iri_calls = [(d, t) for s, d, t in calls if s.startswith("iri")]
    assert iri_calls and all(d < t for d, t in iri_calls), iri_calls
    assert all(d <= t for _, d, t in calls)
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


def test_a_running_iri_round_is_counted_to_its_end_and_teaches_the_sets_to_come() -> None:
    clock = _Clock()
    t = Tracker(None, None, clock=clock)
    # Two IRI sets capped at 70 units each, in 7 rounds of 10; expected to take 0.4 of it.
    t.plan(Plan(Units(forward=10, iri=140), expect=0.4))
    t.enter("iri a")
    assert t.total == 10 + 56
    with t.span(70, weight=1, marks=[k / 7 for k in range(1, 8)]):
        for _ in range(15):  # into the second round: still within the guess of 28
            clock.now += 1.0
            t.step()
        assert t.total == 10 + 56
        for _ in range(16):  # into the fourth round: this set takes at least 40 units, and
            clock.now += 1.0  # the next one expects (0.4 * 70 + 40) / 140 of its own, the
            t.step()  # guess counting as one set
        assert t.total == 31 + (40 - 31) + 10 + round((28 + 40) / 140 * 70)
        forward_pace = PRIOR_SECONDS["forward"] / PRIOR_SECONDS["iri"]  # not seen yet
        assert t.eta_s() == pytest.approx((40 - 31) + 34 + 10 * forward_pace, abs=0.05)


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
