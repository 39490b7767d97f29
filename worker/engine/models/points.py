"""Listing a model's stitch points without a checkpoint (random weights suffice)."""

from __future__ import annotations

from typing import Any

import torch
from stitchsim_worker.engine.models.loading import random_model
from stitchsim_worker.engine.models.network import Network


def list_stitch_points(
    arch: str, arch_kwargs: dict[str, Any] | None = None, image_size: int = 32
) -> dict[str, Any]:
    """{'all': every stitchable module output in execution order, 'stages': stage outputs,
    'blocks': block outputs (where fula aligns by default), 'auto': the points `layers:
    "auto"` picks, 'unstitchable': {module: why not}}."""
    model = random_model(arch, arch_kwargs or {}, image_size)
    network = Network(model, model.preprocess.input_size, torch.device("cpu"), "arch")
    return {
        "all": network.points,
        "stages": network.stage_points(),
        "blocks": network.block_points(),
        "auto": network.auto_points(),
        "unstitchable": dict(network.unstitchable),
    }
