"""The progress plan: a job's work counted up front in units (about one batch through a network
part), from the registered entries' costs (costs.py), so progress and ETA cover the whole job.
The same count, at the models' size (costs.size_factor), is the job's compute budget at
submission (check.py): a spec above the operator's limit is refused before it is queued, with
the fields that make it large. IRIs count at their cap (every extra round): the budget is an
upper bound, and the progress tracker shows them at the share of the cap they are expected to
take (progress.Plan)."""

from __future__ import annotations

from stitchsim import catalogue
from stitchsim.models import AdversarialSettings, IRISettings, Spec, TrainSettings
from stitchsim_worker.engine.iri.synthesis import round_lengths
from stitchsim_worker.engine.job.costs import Sizes, passes, rows_units, test_split_units
from stitchsim_worker.engine.job.prepare import Prepared
from stitchsim_worker.engine.job.progress import Plan, Units
from stitchsim_worker.engine.measures.in_job import measure_units
from stitchsim_worker.engine.protocols.attacks import attack_passes
from stitchsim_worker.engine.protocols.controls import CONTROLS, controls_to_run


def plan_units(spec: Spec, prep: Prepared) -> Plan:
    own = prep.front_data
    return job_plan(spec, Sizes(len(prep.data.train), len(prep.data.test), len(prep.pairs),
                                front_train=len(own.train) if own else None,
                                front_test=len(own.test) if own else None))


def job_plan(spec: Spec, sizes: Sizes) -> Plan:
    return Plan(job_units(spec, sizes), expect=iri_share_expected(spec))


IRI_STEPS_EXPECTED = 100
"""The steps a set of IRIs is expected to need before any set of the job has finished: under
the fast method (momentum included) every stage point of the bench's test_resnet, test_vit and
test_convnext converged in its first round of 100 steps (bench/iri_convergence.py); without
momentum they took 100-700. The paper's method (the default) has one round: all of it."""


def iri_share_expected(spec: Spec) -> float:
    """The share of their cap IRI sets are expected to take: IRI_STEPS_EXPECTED steps, at least
    the first round and at most the cap (a mean over sets, some of which stop a round earlier
    than others). A spec with short rounds (small iri.steps) expects more of its cap."""
    lengths = round_lengths(spec.iri)
    return min(sum(lengths), max(lengths[0], IRI_STEPS_EXPECTED)) / sum(lengths)


def job_units(spec: Spec, sizes: Sizes) -> Units:
    """The whole job: both models on the test split, then in each direction the comparison
    at every stitch pair and the controls."""
    directions = len(spec.direction_list())
    return (Units(forward=_opening_units(spec, sizes))
            + (_comparison_units(spec, sizes) + _controls_units(spec, sizes)) * directions
            + measure_units(spec, sizes, directions))


def _opening_units(spec: Spec, sizes: Sizes) -> int:
    """JobContext.open: each model's logits on its test split, in training batches."""
    n = 2 * passes(sizes.test, spec.train.batch_size)
    if sizes.front_test is not None:
        n += passes(sizes.front_test, spec.train.batch_size)
    return n


def _comparison_units(spec: Spec, sizes: Sizes) -> Units:
    """job.compare in one direction, less the measures: per stitch pair its test split and
    every protocol's rows."""
    per_cut = test_split_units(sizes) + rows_units(spec, sizes, sizes.train, [sizes.test])
    return per_cut * sizes.pairs


def _controls_units(spec: Spec, sizes: Sizes) -> Units:
    total = Units()
    for name in controls_to_run(spec):
        total += CONTROLS[name].cost(spec, sizes)
    return total


_TRAIN, _IRI = TrainSettings(), IRISettings()


def what_to_shrink(spec: Spec, sizes: Sizes) -> list[str]:
    """The spec's fields that multiply its cost beyond the defaults, largest factor first."""
    factors = {
        "train.epochs": spec.train.epochs / _TRAIN.epochs,
        "train.seeds": spec.train.seeds / _TRAIN.seeds,
        "train.batch_size (larger is cheaper)": _TRAIN.batch_size / spec.train.batch_size,
        "layers": float(sizes.pairs),
        "objectives": float(len(spec.objectives)),
        "protocols": float(len(spec.protocols)),
        "directions": float(len(spec.direction_list())),
        "controls / control_settings": _with_controls(spec, sizes),
    }
    if catalogue.PROTOCOLS.any_of(spec.protocols, uses_iris=True):
        factors["iri.steps"] = spec.iri.steps / _IRI.steps
        factors["iri.batch_size (larger is cheaper)"] = _IRI.batch_size / spec.iri.batch_size
    if catalogue.PROTOCOLS.any_of(spec.protocols, attacks=True) or spec.adversarial.evaluate:
        factors["adversarial.steps"] = spec.adversarial.steps / AdversarialSettings().steps
        factors["adversarial.alphas"] = float(len(spec.adversarial.alpha_list()))
    if spec.adversarial.evaluate:
        factors["adversarial.eval_steps / attack"] = (attack_passes(spec.adversarial)
                                                      / attack_passes(AdversarialSettings()))
    if spec.train.max_train_samples is None:
        factors["train.max_train_samples (unset: the whole training split)"] = 2.0
    ranked = sorted(((f, name) for name, f in factors.items() if f > 1.0), reverse=True)
    return [f"{name} (x{f:.3g})" for f, name in ranked]


def _with_controls(spec: Spec, sizes: Sizes) -> float:
    """How many times the comparison's work the job takes with its controls."""
    alone = _comparison_units(spec, sizes)
    both = alone + _controls_units(spec, sizes)
    return both.total / max(1, alone.total)
