"""Preparing a job: the dataset, both models (with their preprocessing chosen), the stitch
pairs. Everything here can fail on a user's mistake, with a Failure that says what to fix."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

import torch
from stitchsim import catalogue
from stitchsim.catalogue import CONTROLS, OBJECTIVES, OUTPUT_KINDS, PROTOCOLS
from stitchsim.failure import Failure
from stitchsim.files.digest import object_id
from stitchsim.models import ModelRef, Spec
from stitchsim.models.spec import thin_points
from stitchsim_worker.engine.core.errors import JobCancelled
from stitchsim_worker.engine.core.resources import CancelFn, Resources
from stitchsim_worker.engine.data.datasets import Dataset, load_dataset
from stitchsim_worker.engine.data.probes import Probe, check_probe_labels, load_probes
from stitchsim_worker.engine.models.loading import LoadedModel, build_model
from stitchsim_worker.engine.models.network import Network, pair_points
from stitchsim_worker.engine.models.preprocess import MEASURE_SAMPLES, measure
from stitchsim_worker.engine.stitching.layer import samples_needed


@dataclass
class Prepared:
    data: Dataset  # the comparison's dataset (in cross-task pairing: the back model's task)
    front: Network
    back: Network
    pairs: list[tuple[str, str]]  # (front model point, back model point)
    ids: dict[str, dict[str, object]]  # per model: what identifies it (keys IRI caches)
    front_data: Dataset | None = None  # cross_task: the front model's own task
    pairing: torch.Tensor | None = None  # cross_task: back-model class of each front class
    probes: list[Probe] = field(default_factory=list)  # spec.probes, in order

    @property
    def resolution(self) -> str:
        """The resolution preset (catalogue.RESOLUTIONS) of the step sizes the spec leaves
        unset: IRIs and attacks step the dataset's pixels (each model resizes after), so the
        images' shorter side decides; the smaller of the two tasks' in cross-task pairing."""
        sides = [d.shorter_side for d in (self.data, self.front_data) if d is not None]
        return catalogue.resolution_of(min(sides))

    def data_of(self, net: Network) -> Dataset:
        """The dataset a model was trained for (its own task in cross-task pairing)."""
        if net.where == "front" and self.front_data is not None:
            return self.front_data
        return self.data

    def classes_into(self, g: Network) -> torch.Tensor:
        """Maps the other model's classes to g's (cross_task): the pairing, or its inverse."""
        assert self.pairing is not None, "only cross-task jobs pair classes"
        if g.where == "back":
            return self.pairing
        return torch.argsort(self.pairing)


def _model(
    ref: ModelRef, where: str, resources: Resources, data: Dataset, device: torch.device
) -> tuple[LoadedModel, str]:
    path, ckpt_id = resources.checkpoint(ref.checkpoint)
    model = build_model(ref, path, ckpt_id, where=where, native_size=data.image_size)
    check_classes(model, data, where)
    model.net.to(device)
    if OUTPUT_KINDS[model.output].classes and data.labelled:
        head = data.train.subset(MEASURE_SAMPLES)  # read from a file only as far as measured
        model.choice = measure(model.choice, model.net, head.images, head.labels, device,
                               data.n_classes)
    elif model.choice.pending:
        note = (f"not measured: the candidates are scored by accuracy, and this model's "
                f"output is an {model.output}" if data.labelled else
                "not measured: the candidates are scored by accuracy, and the dataset has no "
                "labels")
        model.choice = replace(model.choice, info=model.choice.info.model_copy(
            update={"note": note}), pending=())
    return model, ckpt_id or object_id(path)


def check_protocols(spec: Spec, data: Dataset, front_data: Dataset | None,
                    outputs: Outputs = None) -> None:
    """What the protocols need of the spec beyond its own validation (the protocols that pair
    two tasks: their catalogue entries need the front model's own dataset)."""
    pairing = catalogue.PROTOCOLS.where(needs_front_dataset=True)
    cross = [p for p in spec.protocols if p in pairing]
    if cross and front_data is None:
        raise Failure("invalid_spec",
                      f"the {cross[0]} protocol needs front_dataset: the front model's own "
                      "dataset (the back model's is `dataset`)")
    if not cross and front_data is not None:
        raise Failure("invalid_spec",
                      f"front_dataset is only read by the {' or '.join(pairing)} protocol; "
                      f"add \"{pairing[0]}\" to protocols or drop front_dataset")
    if not cross:
        return
    assert front_data is not None
    allowed = cross_task_objectives(back_kinds(spec, outputs))
    if any(o not in allowed for o in spec.objectives):
        raise Failure("invalid_spec",
                      f"{cross[0]} stitches models of different tasks, so no back-model "
                      "output exists for the front model's inputs: it trains towards the "
                      "paired class (hard labels for a classifier, the back model's output on "
                      "an image of the paired class otherwise); set objectives to "
                      f"{json.dumps(list(allowed))}")
    if front_data.n_classes != data.n_classes:
        raise Failure("class_mismatch",
                      f"{cross[0]} pairs classes one to one, but front_dataset has "
                      f"{front_data.n_classes} classes and dataset {data.n_classes}")
    if spec.class_pairing is not None and len(spec.class_pairing) != data.n_classes:
        raise Failure("invalid_spec",
                      f"class_pairing lists {len(spec.class_pairing)} classes; both datasets "
                      f"have {data.n_classes}")


Outputs = dict[str, str] | None
"""Each model's output kind by role ("front", "back"); None before the models are read (then
every model counts as a classifier, the strictest reading)."""


def back_kinds(spec: Spec, outputs: Outputs) -> list[str]:
    """The output kinds of the models that sit behind a stitch in the spec's directions: the
    kinds whose figures and targets the job reads."""
    roles = ["back" if d == "front_to_back" else "front" for d in spec.direction_list()]
    return list(dict.fromkeys((outputs or {}).get(r, "logits") for r in roles))


def cross_task_objectives(kinds: list[str]) -> tuple[str, ...]:
    """What cross-task pairing can train with: hard labels for classifiers; for other kinds,
    the objectives that match the back model's output (or its tensor at the stitch point) on a
    paired-class image, which need no classes and no later tensors."""
    objectives = catalogue.OBJECTIVES
    if any(OUTPUT_KINDS[k].classes for k in kinds):
        return objectives.where(labels_only=True)
    return tuple(o.name for o in objectives
                 if not o.needs_classes and not o.aligns_later_points)


def check_outputs(spec: Spec, outputs: dict[str, str]) -> None:
    """What the back models' output kinds allow: class-score objectives, attacks and robust
    evaluation read class scores, so a back model without classes cannot run them."""
    classless = [k for k in back_kinds(spec, outputs) if not OUTPUT_KINDS[k].classes]
    if not classless:
        return
    kind = OUTPUT_KINDS[classless[0]].label
    wrong = [f"objective {o}" for o in spec.objectives if OBJECTIVES[o].needs_classes]
    wrong += [f"protocol {p}" for p in spec.protocols if PROTOCOLS[p].attacks]
    if spec.adversarial.evaluate:
        wrong.append("adversarial.evaluate")
    if wrong:
        raise Failure("invalid_spec",
                      f"a back model's output is an {kind}, not class scores, and "
                      f"{'; '.join(wrong)} read class scores; drop them (slm matches an "
                      f"{kind} by its output kind's own measure)",
                      {"output": classless[0], "not_allowed": wrong})


def labels_needed(spec: Spec, outputs: Outputs = None) -> list[str]:
    """What in this spec reads class labels, by the catalogue's flags: the one place that
    decides whether an unlabelled dataset can run."""
    needs = []
    for kind in back_kinds(spec, outputs):
        if OUTPUT_KINDS[kind].needs_labels:
            needs.append(f"{OUTPUT_KINDS[kind].label} outputs (their accuracy, stitching "
                         "penalty and error consistency)")
    needs += [f"objective {n}" for n in spec.objectives if OBJECTIVES[n].needs_labels]
    needs += [f"protocol {n}" for n in spec.protocols if PROTOCOLS[n].needs_labels]
    needs += [f"control {n}" for n in spec.controls if CONTROLS[n].needs_labels]
    return needs


def check_labels(spec: Spec, *datasets: Dataset | None, outputs: Outputs = None) -> None:
    """Unlabelled data run where no figure needs labels; elsewhere a 422 naming what does."""
    for data in datasets:
        if data is None or data.labelled:
            continue
        needs = labels_needed(spec, outputs)
        if needs:
            raise Failure(
                "labels_needed",
                f"dataset {data.name} has no labels, and this job needs them for: "
                f"{'; '.join(needs)}; upload it with labels (class folders, a label column or "
                "array), or pick a job that reads none",
                {"dataset": data.name, "needed_by": needs})


def check_all(spec: Spec, data: Dataset, front_data: Dataset | None,
              outputs: dict[str, str], probes: list[Probe] | None = None) -> None:
    """Every check of the spec against its data and its models' output kinds."""
    check_outputs(spec, outputs)
    check_protocols(spec, data, front_data, outputs)
    check_labels(spec, data, front_data, outputs=outputs)
    check_probe_labels(probes or [], labels_needed(spec, outputs))


def probes_of(spec: Spec, resources: Resources, data: Dataset) -> list[Probe]:
    """The spec's probe sets, checked against the dataset. Under cross-task pairing the
    models answer two tasks and no one probe serves both: refused."""
    if spec.probes and spec.front_dataset is not None:
        raise Failure("invalid_spec",
                      "probes are evaluated in the comparison's one class space, and "
                      "front_dataset pairs two tasks; drop probes or front_dataset",
                      {"field": "probes"})
    return load_probes(spec, resources, data)


def check_classes(model: LoadedModel, data: Dataset, where: str) -> None:
    if OUTPUT_KINDS[model.output].classes and model.num_classes < data.n_classes:
        raise Failure("class_mismatch",
                      f"{where}: the model has {model.num_classes} outputs but the dataset has "
                      f"{data.n_classes} classes")


def _identity(model: LoadedModel, checkpoint: str) -> dict[str, object]:
    pre = model.preprocess
    return {
        "checkpoint": checkpoint,
        "arch": model.arch,
        "arch_kwargs": model.arch_kwargs,
        "preprocess": [pre.input_size, pre.mean, pre.std],
    }


def pair_points_of(spec: Spec, front: Network, back: Network) -> list[tuple[str, str]]:
    if spec.layers == "auto":
        points = catalogue.BUDGETS[spec.budget].points
        pairs = pair_points(front.auto_points(), back.auto_points())
        return pairs if points is None else thin_points(pairs, points)
    for pair in spec.layers:
        front.check_point(pair.front)
        back.check_point(pair.back)
    return [(p.front, p.back) for p in spec.layers]


def budget_floor(spec: Spec) -> int | None:
    """The training samples the spec's budget starts from; None where the spec sets them."""
    if spec.train.max_train_samples is not None:
        return None
    return catalogue.BUDGETS[spec.budget].train_samples


def budget_samples(spec: Spec, front: Network, back: Network,
                   pairs: list[tuple[str, str]]) -> int | None:
    """The training samples the spec's budget stands for at these stitch points: its floor,
    raised to what the hungriest stitch needs (stitching.layer.samples_needed), in every
    direction the spec stitches; None where the spec sets them itself or the budget does not."""
    floor = budget_floor(spec)
    if floor is None:
        return None
    ends = {"front_to_back": (front, back), "back_to_front": (back, front)}
    needs = [samples_needed(f.rep(i), g.rep(j))
             for d in spec.direction_list()
             for f, g in [ends[d]]
             for i, j in (pairs if d == "front_to_back" else [(b, a) for a, b in pairs])]
    return max([floor, *needs])


def prepare(
    spec: Spec, resources: Resources, device: torch.device,
    should_cancel: CancelFn | None = None,
) -> Prepared:
    def check_cancel() -> None:  # loading a large model or dataset takes a while
        if should_cancel is not None and should_cancel():
            raise JobCancelled()

    data = load_dataset(spec.dataset, resources, spec.train)
    front_data = None
    if spec.front_dataset is not None:
        front_data = load_dataset(spec.front_dataset, resources, spec.train)
    probes = probes_of(spec, resources, data)
    own = {"front": front_data or data, "back": data}
    networks, ids = {}, {}
    for where in ("front", "back"):
        check_cancel()
        model, ckpt = _model(getattr(spec, where), where, resources, own[where], device)
        networks[where] = Network(model, own[where].image_size, device, where)
        ids[where] = _identity(model, ckpt)
    check_cancel()
    check_all(spec, data, front_data, {w: networks[w].model.output for w in networks}, probes)
    front, back = networks["front"], networks["back"]
    pairing = None
    if front_data is not None:
        pairing = torch.tensor(spec.class_pairing or list(range(data.n_classes)))
    return Prepared(data, front, back, pair_points_of(spec, front, back), ids, front_data,
                    pairing, probes)
