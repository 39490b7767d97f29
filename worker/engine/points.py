"""Listing a model's stitch points without a checkpoint (random weights suffice)."""

from __future__ import annotations

from typing import Any

import torch
from stitchsim.models import ModelRef
from stitchsim_worker.engine.models import _create, _fixed_input_size, check_arch_name
from stitchsim_worker.engine.network import Network


def list_stitch_points(
    arch: str, arch_kwargs: dict[str, Any] | None = None, image_size: int = 32
) -> dict[str, list[str]]:
    """{'all': every module output in execution order, 'stages': stage outputs, 'auto': the
    points `layers: "auto"` picks}."""
    from stitchsim_worker.engine.models import LoadedModel, _preprocess

    check_arch_name(arch, "arch")
    kwargs = arch_kwargs or {}
    net = _create(arch, kwargs, "arch").eval()
    size = _fixed_input_size(net) or image_size
    model = LoadedModel(
        net=net,
        arch=arch,
        arch_kwargs=kwargs,
        checkpoint="",
        num_classes=1,
        preprocess=_preprocess(ModelRef(checkpoint="-"), {}, net, size, "arch"),
    )
    network = Network(model, size, torch.device("cpu"), "arch")
    return {"all": network.points, "stages": network.stage_points(), "auto": network.auto_points()}
