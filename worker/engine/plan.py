"""The progress plan: a job's work counted up front in units (about one batch through a network
part), from the registered entries' costs, so progress and ETA cover the whole job. The same
count is the job's compute budget at submission (check.py): a spec above the operator's limit
is refused before it is queued, with the fields that make it large. IRIs count at their cap
(every extra round): the budget is an upper bound, and the progress tracker shows them at the
share of the cap they are expected to take (progress.Plan)."""

from __future__ import annotations

import math

from stitchsim.models import AdversarialSettings, IRISettings, Spec, TrainSettings
from stitchsim_worker.engine.context import EVAL_BATCH
from stitchsim_worker.engine.controls import CONTROLS, controls_to_run
from stitchsim_worker.engine.iri import round_lengths
from stitchsim_worker.engine.measures import measure_units
from stitchsim_worker.engine.objectives import OBJECTIVES
from stitchsim_worker.engine.preparation import Prepared
from stitchsim_worker.engine.progress import Plan
from stitchsim_worker.engine.protocols import PROTOCOLS


def plan_units(spec: Spec, prep: Prepared) -> Plan:
    return job_plan(spec, len(prep.data.train), len(prep.data.test), len(prep.pairs))


def job_plan(spec: Spec, n_tr: int, n_te: int, n_pairs: int) -> Plan:
    return Plan(units=job_units(spec, n_tr, n_te, n_pairs),
                elastic=iri_cap_units(spec, n_tr, n_pairs),
                expect=max(IRI_EXPECT, spec.iri.steps / sum(round_lengths(spec.iri))))


IRI_EXPECT = 0.4
"""The share of their cap IRIs are expected to take before any finished: on the bench's jobs
(bench/eta_accuracy.py: the demo, `iri`) they took 36-43 % of it, between the first round
alone (1/7 at the defaults) and every extra round. With extra_rounds 0 the cap is the first
round and the share is 1."""


def iri_cap_units(spec: Spec, n_tr: int, n_pairs: int) -> int:
    """The invariance-aware protocol's IRIs in job_units, counted at their cap: how long they
    take is known only as they converge (progress.Plan.elastic)."""
    if "invariance_aware" not in spec.protocols:
        return 0
    runs = 1 + sum(CONTROLS[c].runs(spec) for c in controls_to_run(spec))
    return len(spec.direction_list()) * n_pairs * runs * PROTOCOLS["invariance_aware"].cost(
        spec, n_tr)


def job_units(spec: Spec, n_tr: int, n_te: int, n_pairs: int) -> int:
    """The whole job's units from the dataset's split sizes and the number of stitch pairs."""
    per_fit = spec.train.seeds * sum(OBJECTIVES[o].cost(n_tr, spec.train) for o in spec.objectives)
    if spec.adversarial.evaluate:  # PGD against each stitched model on the test split
        per_fit += (spec.train.seeds * len(spec.objectives) * spec.adversarial.steps
                    * math.ceil(n_te / EVAL_BATCH))
    per_protocol = [
        2 * math.ceil(n_tr / EVAL_BATCH) + per_fit + PROTOCOLS[p].cost(spec, n_tr)
        for p in spec.protocols
    ]
    per_run = 3 * math.ceil(n_te / EVAL_BATCH) + sum(per_protocol)
    runs = 1 + sum(CONTROLS[c].runs(spec) for c in controls_to_run(spec))
    stitches = len(spec.direction_list()) * n_pairs
    return (2 * math.ceil(n_te / EVAL_BATCH) + stitches * per_run * runs
            + measure_units(spec, n_tr, n_te, stitches))


_TRAIN, _IRI = TrainSettings(), IRISettings()


def what_to_shrink(spec: Spec, n_pairs: int) -> list[str]:
    """The spec's fields that multiply its cost beyond the defaults, largest factor first."""
    factors = {
        "train.epochs": spec.train.epochs / _TRAIN.epochs,
        "train.seeds": spec.train.seeds / _TRAIN.seeds,
        "train.batch_size (larger is cheaper)": _TRAIN.batch_size / spec.train.batch_size,
        "layers": float(n_pairs),
        "objectives": float(len(spec.objectives)),
        "protocols": float(len(spec.protocols)),
        "directions": float(len(spec.direction_list())),
        "controls / control_settings": float(
            1 + sum(CONTROLS[c].runs(spec) for c in controls_to_run(spec))),
    }
    if "invariance_aware" in spec.protocols:
        factors["iri.steps"] = spec.iri.steps / _IRI.steps
        factors["iri.batch_size (larger is cheaper)"] = _IRI.batch_size / spec.iri.batch_size
    if "adversarial" in spec.protocols or spec.adversarial.evaluate:
        factors["adversarial.steps"] = spec.adversarial.steps / AdversarialSettings().steps
    if spec.train.max_train_samples is None:
        factors["train.max_train_samples (unset: the whole training split)"] = 2.0
    ranked = sorted(((f, name) for name, f in factors.items() if f > 1.0), reverse=True)
    return [f"{name} (x{f:.3g})" for f, name in ranked]
