"""Listing a model's stitch points: by architecture (random weights suffice), or for a
checkpoint on the meta device (its header's keys and shapes, no weights read)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from stitchsim.models import ModelRef
from stitchsim_worker.engine.core.resources import BuildLimits
from stitchsim_worker.engine.models.loading import meta_model, random_model
from stitchsim_worker.engine.models.network import Network

DEFAULT_NATIVE_SIZE = 32
"""The image side assumed for a checkpoint that names no input size: the built-in datasets'."""


def list_stitch_points(
    arch: str, arch_kwargs: dict[str, Any] | None = None, image_size: int = 32
) -> dict[str, Any]:
    """{'all': every stitchable module output in execution order, 'stages': stage outputs,
    'blocks': block outputs (where fula aligns by default), 'auto': the points `layers:
    "auto"` picks, 'unstitchable': {module: why not}}."""
    model = random_model(arch, arch_kwargs or {}, image_size)
    network = Network(model, model.preprocess.input_size, torch.device("cpu"), "arch")
    return _listing(network)


def _listing(network: Network) -> dict[str, Any]:
    return {
        "all": network.points,
        "stages": network.stage_points(),
        "blocks": network.block_points(),
        "auto": network.auto_points(),
        "unstitchable": dict(network.unstitchable),
    }


def checkpoint_points(ref: ModelRef, path: Path, *, native_size: int = DEFAULT_NATIVE_SIZE,
                      limits: BuildLimits = BuildLimits()) -> dict[str, Any]:
    """A checkpoint's stitch points with their shapes, as the contract's StitchPoints (less
    the checkpoint id): built on the meta device as the spec check builds it, so the names
    and the `auto` pick are the ones a job on this checkpoint would see."""
    model = meta_model(ref, path, where="checkpoint", native_size=native_size, limits=limits)
    size = model.preprocess.input_size
    network = Network(model, size, torch.device("meta"), "checkpoint")
    listing = _listing(network)
    stages, auto = set(listing["stages"]), set(listing["auto"])
    return {
        "arch": model.arch,
        "arch_kwargs": dict(model.arch_kwargs),
        "input_size": size,
        "points": [{"name": p, "shape": list(network.shapes[p]), "stage": p in stages,
                    "auto": p in auto} for p in listing["all"]],
        "unstitchable": listing["unstitchable"],
    }
