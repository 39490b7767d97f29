"""The spec check at submission: everything that can fail on the user's side before a worker
spends time on the job, cheaply enough that the run need not trust it.

Models are built on the meta device (no memory for parameters, no weights read: the
checkpoint's header gives its keys and shapes), a meta forward pass gives the stitch points
and their shapes, and uploaded datasets are read as far as their labels. The run prepares the
job for real once; the check's work costs a fraction of a second per model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from stitchsim import catalogue
from stitchsim.failure import Failure
from stitchsim.models import AdversarialSettings, IRISettings, Spec, TrainSettings
from stitchsim_worker.engine.core.context import EVAL_BATCH
from stitchsim_worker.engine.core.costs import Sizes, size_factor
from stitchsim_worker.engine.core.device import pick_device
from stitchsim_worker.engine.core.resources import Resources
from stitchsim_worker.engine.core.step import Pair, Step, total
from stitchsim_worker.engine.data.datasets import Dataset, load_dataset
from stitchsim_worker.engine.job.plan import job_plan, job_steps
from stitchsim_worker.engine.job.prepare import (
    budget_floor,
    budget_samples,
    check_all,
    check_classes,
    pair_points_of,
    probes_of,
)
from stitchsim_worker.engine.models.attacks import attack_passes
from stitchsim_worker.engine.models.loading import LoadedModel, meta_model
from stitchsim_worker.engine.models.network import EXAMPLE_BATCH, Network

META = torch.device("meta")
FLOAT_BYTES = 4


@dataclass(frozen=True)
class Checked:
    """What the check counted for a spec that can run: its cost before it is queued."""

    units: int
    """The job's budget: its progress plan's batches (IRIs at their cap), each counted at the
    models' size (costs.size_factor)."""
    expected_units: int
    """The units it is expected to take (IRIs at their expected share of the cap)."""
    size_factor: float = 1.0
    """Budget units a batch of this job counts (costs.size_factor)."""
    seconds_per_unit: float | None = None
    """The calibrated workers' seconds a unit at the job's input size (None: not calibrated)."""


def _check_size(model: LoadedModel, where: str, limit: int | None) -> None:
    """Counted on the meta device, so a spec asking for a billion-class head costs nothing to
    refuse."""
    n = sum(p.numel() for p in model.net.parameters())
    if limit is not None and n > limit:
        raise Failure(
            "model_too_large",
            f"{where}: {model.arch} with arch_kwargs {model.arch_kwargs} has {n:,} "
            f"parameters, more than the {limit:,} this service builds "
            "(STITCHSIM_MAX_MODEL_PARAMS); use a smaller architecture or smaller "
            "arch_kwargs (num_classes, embed_dim, depth ...)",
            {"parameters": n, "limit": limit},
        )


def _network(spec: Spec, where: str, resources: Resources, data: Dataset) -> Network:
    ref = getattr(spec, where)
    path, _ = resources.checkpoint(ref.checkpoint)
    model: LoadedModel = meta_model(ref, path, where=where, native_size=data.image_size,
                                    limits=resources.build_limits)
    _check_size(model, where, resources.max_model_params)
    check_classes(model, data, where)
    return Network(model, data.image_size, META, where)


def _datasets(spec: Spec, resources: Resources) -> tuple[Dataset, Dataset | None]:
    """The comparison's dataset and, in cross-task pairing, the front model's own task."""
    data = load_dataset(spec.dataset, resources, spec.train)
    if spec.front_dataset is None:
        return data, None
    return data, load_dataset(spec.front_dataset, resources, spec.train)


def _networks(spec: Spec, resources: Resources, data: Dataset, front_data: Dataset | None
              ) -> tuple[Network, Network]:
    return (_network(spec, "front", resources, front_data or data),
            _network(spec, "back", resources, data))


def _at_budget(spec: Spec, front: Network, back: Network, data: Dataset) -> Spec:
    """`data` is loaded with the spec's own train settings: under a budget floor, every sample;
    the count is capped at what its training split holds, so reports name what ran."""
    if budget_floor(spec) is None:
        return spec
    n = budget_samples(spec, front, back, pair_points_of(spec, front, back))
    if n is None:
        return spec
    return spec.model_copy(update={"train": spec.train.model_copy(
        update={"max_train_samples": min(n, len(data.train))})})


def with_budget_samples(spec: Spec, resources: Resources) -> Spec:
    """The spec with the training samples its budget stands for at the job's stitch points
    (prepare.budget_samples), as the job runs and the check prices it; the spec itself where
    it sets them or its budget does not. The models are built on the meta device for their
    points' shapes."""
    if budget_floor(spec) is None:
        return spec
    data, front_data = _datasets(spec, resources)
    return _at_budget(spec, *_networks(spec, resources, data, front_data), data)


def check_spec(spec: Spec, *, resources: Resources) -> Checked:
    """Raises a Failure with what to fix; returns the job's cost when it can be prepared."""
    pick_device(spec.device)  # checks workers run beside the job workers, on hosts alike
    data, front_data = _datasets(spec, resources)
    probes = probes_of(spec, resources, data)  # before the models: a bad probe is cheap to tell
    front, back = _networks(spec, resources, data, front_data)
    budgeted = _at_budget(spec, front, back, data)
    if budgeted is not spec:  # the budget's training samples: the splits' lengths change
        spec = budgeted
        data, front_data = _datasets(spec, resources)
    check_all(spec, data, front_data, {"front": front.model.output, "back": back.model.output},
              probes)
    _check_activations(spec, (front, back), resources.max_activation_bytes)
    pairs = pair_points_of(spec, front, back)
    if not pairs:
        raise Failure("unknown_layer", "no stitch points could be paired between the two models")
    factor = size_factor(front.flops, back.flops)
    budget = _Budget.of(resources, max(front.preprocess.input_size, back.preprocess.input_size))
    sizes = Sizes(len(data.train), len(data.test), len(pairs),
                  probes=tuple(len(p.test) for p in probes))
    units, expected = _check_budget(spec, sizes, pairs, factor, budget)
    return Checked(units=units, expected_units=expected, size_factor=factor,
                   seconds_per_unit=budget.seconds_per_unit)


def _check_activations(spec: Spec, nets: tuple[Network, Network], limit: int | None) -> None:
    """One batch's activation at the largest module output, from the meta forward's shapes:
    a spec asking for huge inputs (input_size, img_size) or feature maps is refused before
    any worker allocates a batch of them."""
    batch = max(EVAL_BATCH, spec.train.batch_size,
                spec.iri.batch_size if catalogue.PROTOCOLS.any_of(spec.protocols, uses_iris=True)
                else 0)
    worst, where = 0, ""
    for net in nets:
        for name, t in net.traces.items():
            per_sample = math.prod(t.shape) * max(1, t.batch // EXAMPLE_BATCH)
            if per_sample > worst:
                worst, where = per_sample, f"{net.where} {name}"
        # What no module outputs: a ViT's attention matrices grow as tokens² x heads.
        if net.peak_values > worst:
            worst, where = net.peak_values, f"{net.where}: {net.peak_what} inside the forward"
    need = worst * batch * FLOAT_BYTES
    if limit is not None and need > limit:
        raise Failure(
            "job_too_large",
            f"a batch of {batch} at {where} ({worst:,} values a sample) needs {need:,} bytes "
            f"of activation memory, more than the {limit:,} this service allows "
            "(STITCHSIM_MAX_ACTIVATION_BYTES); use smaller inputs (input_size, img_size / "
            "image_size), fewer tokens (a larger patch_size) or smaller batch sizes "
            "(train.batch_size, iri.batch_size)",
            {"activation_bytes": need, "limit": limit, "batch": batch,
             "at": where, "shrink": ["input_size / arch_kwargs.img_size", "patch_size",
                                     "train.batch_size", "iri.batch_size"]},
        )


@dataclass(frozen=True)
class _Budget:
    """The per-job unit limit at the job's input size, and how it was set."""

    limit: int | None
    input_size: int
    seconds_per_unit: float | None = None
    device: str = ""
    reference_limit: int | None = None
    reference_rate: float = 0.0

    @classmethod
    def of(cls, resources: Resources, input_size: int) -> _Budget:
        limit, spu = resources.job_budget(input_size)
        cal = resources.calibration
        return cls(limit, input_size, spu, cal.device if cal else "", resources.max_job_units,
                   cal.reference_seconds_per_unit if cal else 0.0)

    def where(self) -> str:
        """The limit's origin, for the message."""
        if self.seconds_per_unit is None:
            return "per job (STITCHSIM_MAX_JOB_UNITS)"
        return (f"per job on its workers' device ({self.device}: {self.seconds_per_unit:.3g} s "
                f"a unit at {self.input_size} px, so STITCHSIM_MAX_JOB_UNITS="
                f"{self.reference_limit:,} units at the reference's "
                f"{self.reference_rate:g} s become {self.limit:,})")

    def details(self) -> dict[str, object]:
        if self.seconds_per_unit is None:
            return {}
        return {"seconds_per_unit": self.seconds_per_unit, "input_size": self.input_size,
                "device": self.device, "reference_limit": self.reference_limit}


def _check_budget(spec: Spec, sizes: Sizes, pairs: list[Pair], factor: float,
                  budget: _Budget) -> tuple[int, int]:
    """The job's work in budget units (the batches of the steps it would run, at the models'
    size factor), and the units it is expected to take, against the per-job limit."""
    steps = job_steps(spec, sizes, pairs)
    plan = job_plan(spec, steps)
    units, expected = round(plan.units * factor), round(plan.expected * factor)
    limit = budget.limit
    if limit is None or units <= limit:
        return units, expected
    shrink = what_to_shrink(spec, sizes, steps)
    if factor > 1:
        shrink.insert(0, f"the models (x{factor:.3g} the compute a sample of a resnet18 on "
                         "32x32 inputs: a smaller architecture or input_size)")
    raise Failure(
        "job_too_large",
        f"the job would take {units:,} work units (about one batch through a network part of "
        f"a resnet18 on 32x32 inputs each), more than the {limit:,} this service allows "
        f"{budget.where()}; shrink "
        f"{', '.join(shrink[:4]) or 'the dataset or the stitch points'}",
        {"units": units, "expected_units": expected, "limit": limit,
         "shrink": shrink, "size_factor": round(factor, 3), "batches": plan.units,
         "n_train": sizes.train, "n_test": sizes.test, "stitch_pairs": sizes.pairs,
         **budget.details()},
    )


_TRAIN, _IRI = TrainSettings(), IRISettings()


def what_to_shrink(spec: Spec, sizes: Sizes, steps: list[Step]) -> list[str]:
    """The spec's fields that multiply its cost beyond the defaults, largest factor first."""
    factors = {
        "train.epochs": spec.train.epochs / _TRAIN.epochs,
        "train.seeds": spec.train.seeds / _TRAIN.seeds,
        "train.batch_size (larger is cheaper)": _TRAIN.batch_size / spec.train.batch_size,
        "layers": float(sizes.pairs),
        "objectives": float(len(spec.objectives)),
        "protocols": float(len(spec.protocols)),
        "directions": float(len(spec.direction_list())),
        "controls / control_settings": _with_controls(steps),
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


def _with_controls(steps: list[Step]) -> float:
    """How many times the comparison's work the job takes with its controls."""
    alone = total([s for s in steps if s.part == "stitch"])
    both = alone + total([s for s in steps if s.part == "control"])
    return both.total / max(1, alone.total)
