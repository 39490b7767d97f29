"""The progress plan: a job's work counted up front in units (about one batch through a
network part), from the registered entries' costs, so progress and ETA cover the whole job."""

from __future__ import annotations

import math

from stitchsim.models import Spec
from stitchsim_worker.engine.context import EVAL_BATCH
from stitchsim_worker.engine.controls import CONTROLS, controls_to_run
from stitchsim_worker.engine.measures import measure_units
from stitchsim_worker.engine.objectives import OBJECTIVES
from stitchsim_worker.engine.preparation import Prepared
from stitchsim_worker.engine.protocols import PROTOCOLS


def plan_units(spec: Spec, prep: Prepared) -> int:
    n_tr, n_te = len(prep.data.train), len(prep.data.test)
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
    stitches = len(spec.direction_list()) * len(prep.pairs)
    return (2 * math.ceil(n_te / EVAL_BATCH) + stitches * per_run * runs
            + measure_units(spec, n_tr, n_te, stitches))
