"""timm: a registry name built with pretrained=False (today's behaviour; plain names are timm).
A hub-layout folder's config.json gives the name, kwargs and its pretrained_cfg."""

from __future__ import annotations

import timm
from stitchsim_worker.engine.models.sources import (
    Build,
    SourceEntry,
    SourceInfo,
    build_with,
    register_source,
)
from torch import nn


def _build(b: Build) -> nn.Module:
    return build_with("timm", lambda name, **kw: timm.create_model(name, pretrained=False, **kw), b)


def fixed_input_size(net: nn.Module) -> int | None:
    patch_embed = getattr(net, "patch_embed", None)
    size = getattr(patch_embed, "img_size", None)
    # Position embeddings are sized for img_size, whether or not the patch embed checks it.
    if size is not None and not getattr(patch_embed, "dynamic_img_size", False):
        return int(size[0] if isinstance(size, (tuple, list)) else size)
    cfg = getattr(net, "pretrained_cfg", {}) or {}
    if cfg.get("fixed_input_size"):
        return int(cfg["input_size"][-1])
    return None


def _describe(net: nn.Module, b: Build) -> SourceInfo:
    cfg = timm.data.resolve_data_config({}, model=net)
    grid = getattr(getattr(net, "patch_embed", None), "grid_size", None)
    own = b.config.preprocess if b.config is not None and b.config.layout == "timm" else None
    return SourceInfo(
        stages=None,  # timm's feature_info
        fixed_size=fixed_input_size(net),
        convention=("timm", _triple(cfg["mean"]), _triple(cfg["std"])),
        own=own if own is not None and own.mean is not None and own.std is not None else None,
        num_prefix_tokens=int(getattr(net, "num_prefix_tokens", 0) or 0),
        patch_grid=(int(grid[0]), int(grid[1])) if grid is not None else None,
        output_fmt=str(getattr(net, "output_fmt", "NCHW")),
        metadata=b.config.summary() if b.config is not None else {},
    )


def _triple(v: object) -> tuple[float, float, float]:
    return (float(v[0]), float(v[1]), float(v[2]))  # type: ignore[index]


def _similar(name: str) -> list[str]:
    return timm.list_models(f"*{name[:12]}*")


register_source(SourceEntry(
    name="timm", build=_build, knows=timm.is_model, similar=_similar, describe=_describe,
    listing=timm.list_models))
