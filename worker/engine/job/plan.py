"""A job's steps: the plan is the run. One list, built from the spec, the split sizes and the
stitch pairs, says in order what the job does, what each piece costs in work units (about one
batch through a network part) and how it runs. The runner runs it (run.py) and the progress
bar and ETA count it; the spec check builds the same list from the models on the meta device
and sums it, at the models' size (costs.size_factor), for the job's compute budget (check.py).

IRIs count at their cap (every extra round): the budget is an upper bound, and the progress
tracker shows them at the share of the cap they are expected to take (progress.Plan)."""

from __future__ import annotations

from collections.abc import Sequence

from stitchsim.models import Direction, Protocol, ResultRow, Spec
from stitchsim_worker.engine.core.context import Cut, cut_label, front_point
from stitchsim_worker.engine.core.costs import Sizes, passes
from stitchsim_worker.engine.core.progress import Plan, Units
from stitchsim_worker.engine.core.step import JobRun, Pair, Step, plan_of
from stitchsim_worker.engine.iri.synthesis import round_lengths
from stitchsim_worker.engine.job.measuring import measure_steps
from stitchsim_worker.engine.job.prepare import Prepared
from stitchsim_worker.engine.protocols.controls import CONTROL_IMPLS, controls_to_run
from stitchsim_worker.engine.protocols.fitting import protocol_steps, training_inputs
from stitchsim_worker.engine.stitching.activations import (
    InputSet,
    Split,
    probe_split,
    test_split,
)


def job_steps(spec: Spec, sizes: Sizes, pairs: Sequence[Pair]) -> list[Step]:
    """The whole job in order: both models on the test split; in each direction the
    comparison at every stitch pair, each followed by its measures; then each control in
    each direction."""
    steps = [_open(spec, sizes)]
    for n, direction in enumerate(spec.direction_list()):
        for pair in pairs:
            steps += _comparison(spec, sizes, direction, pair)
            if spec.measures:
                steps += measure_steps(spec, sizes, direction, pair, first_direction=n == 0)
    for name in controls_to_run(spec):
        for direction in spec.direction_list():
            steps += CONTROL_IMPLS[name].steps(spec, sizes, direction, pairs)
    return steps


def prepared_steps(spec: Spec, prep: Prepared) -> list[Step]:
    """The steps of a prepared job, on its real split sizes (the front model's own task's
    too, under cross-task pairing)."""
    own = prep.front_data
    sizes = Sizes(len(prep.data.train), len(prep.data.test), len(prep.pairs),
                  front_train=len(own.train) if own else None,
                  front_test=len(own.test) if own else None,
                  probes=tuple(len(p.test) for p in prep.probes))
    return job_steps(spec, sizes, prep.pairs)


def job_plan(spec: Spec, steps: Sequence[Step]) -> Plan:
    return plan_of(steps, expect=iri_share_expected(spec))


def _open(spec: Spec, sizes: Sizes) -> Step:
    """JobContext.open: each model on its test split (the front model on its own task's
    too), in training batches."""
    n = 2 * sum(passes(k, spec.train.batch_size) for k in (sizes.test, *sizes.probes))
    if sizes.front_test is not None:
        n += passes(sizes.front_test, spec.train.batch_size)
    return Step("prepare", Units(forward=n), lambda job: job.ctx.open())


def _comparison(spec: Spec, sizes: Sizes, direction: Direction, pair: Pair) -> list[Step]:
    """Every protocol and objective at one stitch pair: its test split, then every
    protocol's training split and fits."""
    label, test = cut_label(direction, pair), test_split(sizes.test)
    probes = [probe_split(k) for k in sizes.probes]

    def begin(job: JobRun) -> tuple[Cut, InputSet, list[Split]]:
        ctx = job.ctx
        cut = ctx.cut(direction, pair)
        on_probes = [p.run(ctx, cut, k) for k, p in enumerate(probes)]
        return cut, training_inputs(ctx), [test.run(ctx, cut), *on_probes]

    def finish(job: JobRun, rows: list[list[ResultRow]], tests: list[Split],
               made: dict[Protocol, Split]) -> None:
        found, test = rows[0], tests[0]
        job.results += found
        for k, probe_rows in enumerate(rows[1:]):
            # A protocol with a test split of its own (cross-task) is refused with probes.
            job.probe_results.setdefault(k, []).extend(probe_rows)
        if spec.measures:  # kept for the measures step right after, which reads them
            job.splits[(direction, pair)] = (test, made)

    opening = test.units + sum((p.units for p in probes), Units())
    return protocol_steps(spec, sizes, (f"stitch {label}", opening), begin,
                          finish, label, front_point(direction, pair),
                          [sizes.test, *sizes.probes])


IRI_STEPS_EXPECTED = 100
"""The steps a set of IRIs is expected to need before any set of the job has finished: under
the fast method (momentum included) every stage point of the bench's test_resnet, test_vit and
test_convnext converged in its first round of 100 steps (bench/iri_convergence.py); without
momentum they took 100-700. The paper's method (the default) is expected to take its first
round of 200; its finishing rounds (issue 36) show in the bar as they run."""


def iri_share_expected(spec: Spec) -> float:
    """The share of their cap IRI sets are expected to take: IRI_STEPS_EXPECTED steps, at least
    the first round and at most the cap (a mean over sets, some of which stop a round earlier
    than others). A spec with short rounds (small iri.steps) expects more of its cap."""
    lengths = round_lengths(spec.iri)
    return min(sum(lengths), max(lengths[0], IRI_STEPS_EXPECTED)) / sum(lengths)
