"""torchvision: a classification architecture of torchvision.models, built with weights=None.
Its preprocessing convention is its own weights' transforms (read from the weights enum's
metadata; nothing is downloaded)."""

from __future__ import annotations

import difflib
import functools

import torchvision
from stitchsim_worker.engine.models.sources import (
    IMAGENET,
    Build,
    Candidate,
    SourceEntry,
    SourceInfo,
    build_with,
    register_source,
)
from torch import nn
from torchvision import models as tvm


@functools.cache
def _names() -> tuple[str, ...]:
    # Classifiers only: detection, segmentation, video and quantized models take other inputs.
    return tuple(tvm.list_models(module=torchvision.models))


def _build(b: Build) -> nn.Module:
    return build_with("torchvision", lambda name, **kw: tvm.get_model(name, weights=None, **kw), b)


def _convention(name: str) -> Candidate:
    try:
        weights = list(tvm.get_model_weights(name))
        t = weights[0].transforms()  # a transform object: mean, std, sizes; no download
        return ("torchvision", tuple(t.mean), tuple(t.std))  # type: ignore[return-value]
    except (ValueError, KeyError, IndexError, AttributeError, TypeError):
        return ("torchvision", IMAGENET[1], IMAGENET[2])


# Stage outputs of the families whose feature stages are not the top-level children.
_STAGE_PARENTS = ("features", "layers", "encoder.layers", "blocks", "trunk_output")


def _stages(net: nn.Module) -> list[str]:
    names = dict(net.named_modules())
    if all(f"layer{k}" in names for k in range(1, 5)):  # resnets, resnexts, wide resnets
        return ["maxpool", "layer1", "layer2", "layer3", "layer4"]
    for parent in _STAGE_PARENTS:
        module = names.get(parent)
        if isinstance(module, nn.Sequential) and len(module) >= 3:
            return [f"{parent}.{k}" for k in range(len(module))]
    return []  # Network spaces points evenly


def _describe(net: nn.Module, b: Build) -> SourceInfo:
    size = getattr(net, "image_size", None)  # VisionTransformer's position embeddings
    tokens = 1 if getattr(net, "class_token", None) is not None else 0
    grid = None
    if isinstance(size, int) and hasattr(net, "patch_size"):
        grid = (size // net.patch_size, size // net.patch_size)
    return SourceInfo(
        stages=_stages(net) or None,
        fixed_size=size if isinstance(size, int) else None,
        convention=_convention(b.name),
        num_prefix_tokens=tokens,
        patch_grid=grid,
    )


register_source(SourceEntry(
    name="torchvision", build=_build, knows=lambda n: n in _names(),
    similar=lambda n: difflib.get_close_matches(n, _names(), n=8, cutoff=0.4),
    describe=_describe, listing=lambda: list(_names()), preload=_names))
