"""Architectures that are neither timm's, torchvision's nor transformers': the project's own
(`stitchsim:NAME`, models.builtin) and an operator's plugins (`plugin:NAME`).

A plugin is a Python distribution the deployment installs into its worker image, declaring
entry points in the group `stitchsim.architectures`:

    [project.entry-points."stitchsim.architectures"]
    tinynet = "acme_models.tiny:build"      # build(**arch_kwargs) -> torch.nn.Module

so a team compares its in-house networks on its own service while the service never runs
uploaded code: only installed code builds networks, the checkpoint brings weights alone. A
built module may say more with two attributes: `stitchsim_stages` (stage output names, the
points `layers: "auto"` picks from) and `stitchsim_preprocess` ({"mean": [...], "std": [...]},
the normalisation it was trained with, measured first).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from stitchsim.failure import Failure
from stitchsim_worker.engine.models import (
    autoencoder as _autoencoder,  # noqa: F401 - registers it
    builtin,
)
from stitchsim_worker.engine.models.sources import (
    OWN,
    Build,
    Candidate,
    SourceEntry,
    SourceInfo,
    check_kwargs,
    register_source,
)
from torch import nn

ENTRY_POINT_GROUP = "stitchsim.architectures"


def plugins() -> dict[str, Any]:
    """Installed plugin architectures: entry point name -> entry point (loaded on build)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _call(builder: Callable[..., nn.Module], b: Build, label: str) -> nn.Module:
    check_kwargs(b.kwargs, b.where)
    net = builder(**b.kwargs)  # a refusal is the kwargs' fault: models.guard names the field
    if not isinstance(net, nn.Module):
        raise Failure("unknown_arch", f"{b.where}: {label} {b.name!r} built a "
                      f"{type(net).__name__}, not a torch.nn.Module (the operator's plugin "
                      "is broken)")
    return net


def _convention(net: nn.Module) -> Candidate | None:
    pre = getattr(net, "stitchsim_preprocess", None)
    if isinstance(pre, dict) and "mean" in pre and "std" in pre:
        mean, std = pre["mean"], pre["std"]
        return ("declared", (float(mean[0]), float(mean[1]), float(mean[2])),
                (float(std[0]), float(std[1]), float(std[2])))
    return None


def _describe(label: str) -> Callable[[nn.Module, Build], SourceInfo]:
    def describe(net: nn.Module, b: Build) -> SourceInfo:
        stages = getattr(net, "stitchsim_stages", None)
        return SourceInfo(
            stages=list(stages) if stages else None,
            convention=_convention(net),
            metadata={"source": label, "name": b.name},
        )

    return describe


register_source(SourceEntry(
    name=OWN,
    build=lambda b: _call(builtin.architectures()[b.name], b, "stitchsim architecture"),
    knows=lambda n: n in builtin.architectures(),
    similar=lambda n: difflib.get_close_matches(n, list(builtin.architectures()), n=8),
    describe=_describe("stitchsim"), listing=lambda: sorted(builtin.architectures())))

register_source(SourceEntry(
    name="plugin",
    build=lambda b: _call(plugins()[b.name].load(), b, "plugin architecture"),
    knows=lambda n: n in plugins(),
    similar=lambda n: difflib.get_close_matches(n, list(plugins()), n=8),
    describe=_describe("plugin"), listing=lambda: sorted(plugins())))
