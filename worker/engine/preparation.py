"""Preparing a job: the dataset, both models (with their preprocessing chosen), the stitch
pairs. Everything here can fail on a user's mistake, with a SpecError that says what to fix."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from stitchsim.models import ModelRef, Spec
from stitchsim_worker.engine.data import Dataset, file_sha256, load_dataset
from stitchsim_worker.engine.errors import JobCancelled, SpecError
from stitchsim_worker.engine.models import LoadedModel, build_model
from stitchsim_worker.engine.network import Network, pair_points
from stitchsim_worker.engine.preprocess import measure
from stitchsim_worker.engine.resources import CancelFn, Resources


@dataclass
class Prepared:
    data: Dataset
    front: Network
    back: Network
    pairs: list[tuple[str, str]]  # (front model point, back model point)
    ids: dict[str, dict[str, object]]  # per model: what identifies it (keys IRI caches)


def _model(
    ref: ModelRef, where: str, resources: Resources, data: Dataset, device: torch.device
) -> tuple[LoadedModel, str]:
    path, ckpt_id = resources.checkpoint(ref.checkpoint)
    model = build_model(ref, path, ckpt_id, where=where, native_size=data.image_size)
    check_classes(model, data, where)
    model.net.to(device)
    model.choice = measure(model.choice, model.net, data.train.images, data.train.labels, device)
    return model, ckpt_id or f"sha256:{file_sha256(path)}"


def check_classes(model: LoadedModel, data: Dataset, where: str) -> None:
    if model.num_classes < data.n_classes:
        raise SpecError(
            f"{where}: the model has {model.num_classes} outputs but the dataset has "
            f"{data.n_classes} classes",
            code="class_mismatch",
        )


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
        return pair_points(front.auto_points(), back.auto_points())
    for pair in spec.layers:
        front.check_point(pair.front)
        back.check_point(pair.back)
    return [(p.front, p.back) for p in spec.layers]


def prepare(
    spec: Spec, resources: Resources, device: torch.device,
    should_cancel: CancelFn | None = None,
) -> Prepared:
    def check_cancel() -> None:  # loading a large model or dataset takes a while
        if should_cancel is not None and should_cancel():
            raise JobCancelled()

    data = load_dataset(spec.dataset, resources, spec.train)
    networks, ids = {}, {}
    for where in ("front", "back"):
        check_cancel()
        model, ckpt = _model(getattr(spec, where), where, resources, data, device)
        networks[where] = Network(model, data.image_size, device, where)
        ids[where] = _identity(model, ckpt)
    check_cancel()
    front, back = networks["front"], networks["back"]
    return Prepared(data, front, back, pair_points_of(spec, front, back), ids)
