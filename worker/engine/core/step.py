"""A step of a job: the stage it shows, the work units it takes and how it runs. A job is one
list of steps (plan.py builds it): the spec check sums the list for the budget without running
it, and the runner runs it in order, entering each step's stage, so the count and the run
cannot drift apart. The list goes down to the fit: at each cut, a step makes its test
splits, then each protocol's training split is a step and each of its fits (alpha x objective
x seed) is one (protocols/fitting.protocol_steps), each built with its units beside its run.
The batches inside report them as they go (Tracker.step);
tests/engine/test_progress_accounting.py holds every step's report to its count."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stitchsim.models import Direction, ResultRow
from stitchsim_worker.engine.core.context import JobContext
from stitchsim_worker.engine.core.progress import ELASTIC, Plan, Tracker, Units

if TYPE_CHECKING:
    from stitchsim_worker.engine.job.measuring import MeasureRun
    from stitchsim_worker.engine.stitching.activations import Split

Pair = tuple[str, str]
"""A stitch pair: (front model point, back model point), as the report names it."""


@dataclass
class JobRun:
    """What the steps of one job share as it runs: its context and the rows collected so far."""

    ctx: JobContext
    measured: MeasureRun
    results: list[ResultRow] = field(default_factory=list)
    controls: list[ResultRow] = field(default_factory=list)
    probe_results: dict[int, list[ResultRow]] = field(default_factory=dict)
    """Each probe set's rows (by its index in prep.probes), as the comparison steps made them."""
    splits: dict[tuple[Direction, Pair], tuple[Split, dict]] = field(default_factory=dict)
    """Each cut's test split and the training splits its protocols made, kept from its
    comparison step for its measures step (which reads the activations instead of
    computing them again)."""


@dataclass(frozen=True)
class Step:
    stage: str | None
    """What the progress shows while it runs; None: it goes on in the stage of the step before
    it (a protocol's training split, a fit of a stage's second seed)."""
    units: Units
    run: Callable[[JobRun], None]
    part: str = ""
    """The part of the job it belongs to (prepare, stitch, measures, control), which the
    budget's breakdown groups by; by default its stage's first word."""

    def __post_init__(self) -> None:
        if not self.part:
            assert self.stage is not None, "a step that opens no stage names its part"
            object.__setattr__(self, "part", self.stage.split(" ")[0])


def total(steps: Sequence[Step]) -> Units:
    units = Units()
    for step in steps:
        units += step.units
    return units


def plan_of(steps: Sequence[Step], expect: float) -> Plan:
    """The steps' work, the elastic part (IRIs) expected to take `expect` of its cap."""
    return Plan(total(steps), expect=expect)


@dataclass(frozen=True)
class Reported:
    """One step's units as planned and as its batches reported them."""

    stage: str
    planned: Units
    reported: Units

    def mismatch(self) -> str | None:
        """What differs, in words: a fixed kind of work reported other than counted, or
        elastic work (IRIs) past its cap; None when the step kept to its count."""
        planned, reported = self.planned.by_kind, self.reported.by_kind
        wrong = [f"{k} {round(reported.get(k, 0))} of {round(planned.get(k, 0))}"
                 for k in sorted(set(planned) | set(reported))
                 if (round(reported.get(k, 0)) > round(planned.get(k, 0)) if k == ELASTIC
                     else round(reported.get(k, 0)) != round(planned.get(k, 0)))]
        return f"{self.stage}: reported {', '.join(wrong)} planned" if wrong else None


def run_steps(steps: Sequence[Step], job: JobRun, tracker: Tracker) -> list[Reported]:
    """Runs the steps in order, each under its own stage, and returns what each reported
    against its count (a mismatch names the step whose count is wrong)."""
    reported = []
    for n, step in enumerate(steps):
        # The first goes on in the stage the job opened with, as does a step with no stage.
        if step.stage is not None and (n or tracker.stage != step.stage):
            tracker.enter(step.stage)
        stage, before = tracker.stage, tracker.reported
        step.run(job)
        reported.append(Reported(stage, step.units, tracker.reported - before))
    return reported
