"""How a stitch point's representation is laid out per sample: a map, a token sequence or a
vector (its shape read against the model's own format). The stitch layer (stitching/layer.py)
maps one such layout to another."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Rep:
    """Shape of a representation at a stitch point (per sample, batch dimension excluded)."""

    kind: str  # "map" | "tokens" | "vector"
    channels: int
    grid: tuple[int, int]
    prefix: int = 0
    channels_last: bool = False  # NHWC maps (e.g. Swin stages)

    def describe(self) -> str:
        h, w = self.grid
        if self.kind == "map":
            return f"map {self.channels}x{h}x{w}" + (" (NHWC)" if self.channels_last else "")
        if self.kind == "tokens":
            return f"tokens {self.prefix}+{h * w}x{self.channels}"
        return f"vector {self.channels}"


def rep_of(
    shape: tuple[int, ...],
    *,
    prefix_tokens: int,
    output_fmt: str,
    patch_grid: tuple[int, int] | None = None,
) -> Rep:
    """Reads a per-sample shape as a map, a token sequence or a vector.

    Inputs are square, so a map's two spatial sizes are equal: that tells (C, H, W) from
    (H, W, C) point by point (a Swin patch embedding's convolution is NCHW inside an NHWC
    model; MaxViT's attention blocks run NHWC inside an NCHW one). The model's own format
    decides only where the shape cannot (C = H = W). Raises ValueError saying why not.
    """
    if len(shape) == 3:
        a, b, c = shape
        nchw, nhwc = b == c, a == b
        if nchw and nhwc:
            nchw = output_fmt != "NHWC"
        if nchw:
            return Rep("map", a, (b, c))
        if nhwc:
            return Rep("map", c, (a, b), channels_last=True)
    if len(shape) == 2:
        n, c = shape
        prefix = _prefix(n, prefix_tokens, patch_grid)
        grid = patch_grid if patch_grid and n - prefix == patch_grid[0] * patch_grid[1] else None
        return Rep("tokens", c, grid or _token_grid(n - prefix), prefix)
    if len(shape) == 1:
        return Rep("vector", shape[0], (1, 1))
    raise ValueError(f"per-sample shape {shape} has no map/token/vector reading")


def _prefix(n: int, prefix_tokens: int, patch_grid: tuple[int, int] | None) -> int:
    """Prefix (class, distillation, register) tokens of an n-token sequence: the model's count
    where the rest is the patch grid (or square), none where n alone is (before they join)."""
    if not prefix_tokens or n <= prefix_tokens:
        return 0
    patches = patch_grid[0] * patch_grid[1] if patch_grid else None
    if patches is not None and n in (patches, patches + prefix_tokens):
        return 0 if n == patches else prefix_tokens
    if _is_square(n) and not _is_square(n - prefix_tokens):
        return 0
    return prefix_tokens


def _is_square(n: int) -> bool:
    return math.isqrt(n) ** 2 == n


def _token_grid(n: int) -> tuple[int, int]:
    side = math.isqrt(n)
    return (side, side) if side * side == n else (1, n)
