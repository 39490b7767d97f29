"""The project's own architectures (the `stitchsim:` model source): networks the service ships
itself, such as its experiments' autoencoders. A module that defines one registers it here
with `register_architecture(name, builder)`; `builder(**arch_kwargs)` returns the module with
random weights."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

Builder = Callable[..., nn.Module]
_ARCHITECTURES: dict[str, Builder] = {}


def register_architecture(name: str, builder: Builder) -> Builder:
    if name in _ARCHITECTURES:
        raise ValueError(f"architecture {name!r} is registered twice")
    _ARCHITECTURES[name] = builder
    return builder


def architectures() -> dict[str, Builder]:
    """Every registered architecture by name."""
    return dict(_ARCHITECTURES)


def build(name: str, **kwargs: Any) -> nn.Module:
    return _ARCHITECTURES[name](**kwargs)
