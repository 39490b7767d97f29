"""The stitch layer T and its closed-form least-squares fit.

Every representation is viewed in one canonical form: optional prefix tokens (B, P, C) plus a
grid (B, C, h, w). Feature maps are grids, token sequences are prefix tokens plus patch tokens
reshaped to their grid, vectors are 1x1 grids. T resizes the source grid to the target grid
(bilinear), then applies one channel-wise affine map everywhere: a 1x1 convolution for maps,
a token-wise linear layer for tokens, a linear layer for vectors.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from stitchsim_worker.engine.models.rep import Rep
from torch import nn


def to_canonical(x: torch.Tensor, rep: Rep) -> tuple[torch.Tensor | None, torch.Tensor]:
    if rep.kind == "map":
        return None, (x.permute(0, 3, 1, 2) if rep.channels_last else x)
    if rep.kind == "vector":
        return None, x[:, :, None, None]
    prefix = x[:, : rep.prefix] if rep.prefix else None
    h, w = rep.grid
    grid = x[:, rep.prefix :].transpose(1, 2).reshape(x.shape[0], rep.channels, h, w)
    return prefix, grid


def from_canonical(prefix: torch.Tensor | None, grid: torch.Tensor, rep: Rep) -> torch.Tensor:
    if rep.kind == "map":
        return grid.permute(0, 2, 3, 1) if rep.channels_last else grid
    if rep.kind == "vector":
        return grid[:, :, 0, 0]
    tokens = grid.flatten(2).transpose(1, 2)
    return torch.cat([prefix, tokens], dim=1) if prefix is not None else tokens


MIN_VECTORS_PER_UNKNOWN = 10
"""Below this many activation vectors per unknown a stitch overfits its training inputs and its
agreement on the test split sits low for want of samples, not of similarity: on the drift
series (docs/benchmarks.md, Drift power) a ConvNeXt's 2x2 last stage fitted at 5 per unknown
(64 samples) came out 0.05 under the same stitch at 10 (128 samples), more than the spread of
benign retrains there. Ten observations per parameter is the usual rule for a regression."""


def unknowns_per_output(src: Rep) -> int:
    """Unknowns of each output channel's affine map: a weight per source channel, a bias."""
    return src.channels + 1


def vectors_of(dst: Rep, n: int) -> int:
    """Activation vectors n samples give the affine map to fit: one per target position."""
    h, w = dst.grid
    return n * (h * w + dst.prefix)


def samples_needed(src: Rep, dst: Rep) -> int:
    """Samples that give a stitch src -> dst MIN_VECTORS_PER_UNKNOWN vectors per unknown."""
    return math.ceil(MIN_VECTORS_PER_UNKNOWN * unknowns_per_output(src) / vectors_of(dst, 1))


class StitchLayer(nn.Module):
    """T: source representation -> target representation (resize, then channel-wise affine)."""

    def __init__(self, src: Rep, dst: Rep):
        super().__init__()
        self.src, self.dst = src, dst
        self.weight = nn.Parameter(torch.zeros(dst.channels, src.channels))
        self.bias = nn.Parameter(torch.zeros(dst.channels))

    def describe(self) -> str:
        steps = []
        if self.src.kind == "tokens" and self.src.prefix and not self.dst.prefix:
            steps.append(f"{self.src.prefix} prefix token(s) dropped")
        if self.src.kind == "tokens" and self.dst.kind != "tokens":
            steps.append(f"patch tokens reshaped to a {self.src.grid[0]}x{self.src.grid[1]} grid")
        if self.dst.prefix and self.src.prefix != self.dst.prefix:
            steps.append("target prefix token(s) from the mean of the source grid")
        if self.src.grid != self.dst.grid:
            mode = "average-pooled" if self.dst.kind == "vector" else "bilinearly resized"
            steps.append(f"grid {mode} to {self.dst.grid[0]}x{self.dst.grid[1]}")
        op = {"map": "1x1 conv", "tokens": "token-wise linear", "vector": "linear"}[self.dst.kind]
        steps.append(f"{op} {self.src.channels}->{self.dst.channels} with bias")
        return f"{self.src.describe()} -> {self.dst.describe()}: " + "; ".join(steps)

    def features(self, x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Source tensor resized to the target layout, before the affine map."""
        prefix, grid = to_canonical(x, self.src)
        if self.dst.prefix:
            if prefix is None or prefix.shape[1] != self.dst.prefix:
                pooled = grid.mean(dim=(2, 3))[:, None, :]
                prefix = pooled.expand(-1, self.dst.prefix, -1)
        else:
            prefix = None
        if grid.shape[-2:] != self.dst.grid:
            if self.dst.kind == "vector":
                grid = grid.mean(dim=(2, 3), keepdim=True)
            else:
                grid = F.interpolate(grid, size=self.dst.grid, mode="bilinear", align_corners=False)
        return prefix, grid

    def _affine_grid(self, grid: torch.Tensor) -> torch.Tensor:
        return F.conv2d(grid, self.weight[:, :, None, None], self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        prefix, grid = self.features(x)
        out_prefix = F.linear(prefix, self.weight, self.bias) if prefix is not None else None
        return from_canonical(out_prefix, self._affine_grid(grid), self.dst)


def positions(prefix: torch.Tensor | None, grid: torch.Tensor) -> torch.Tensor:
    """All positions as rows (n_positions, C): each spatial position or token is a sample."""
    rows = grid.permute(0, 2, 3, 1).reshape(-1, grid.shape[1])
    return torch.cat([prefix.reshape(-1, prefix.shape[-1]), rows]) if prefix is not None else rows


class LeastSquares:
    """Accumulates the normal equations in float64, batch by batch (memory stays bounded)."""

    def __init__(self, stitch: StitchLayer):
        self.stitch = stitch
        n_in = stitch.src.channels + 1
        self.xtx = torch.zeros(n_in, n_in, dtype=torch.float64)
        self.xty = torch.zeros(n_in, stitch.dst.channels, dtype=torch.float64)

    @torch.no_grad()
    def add(self, source: torch.Tensor, target: torch.Tensor) -> None:
        x = positions(*self.stitch.features(source)).double().cpu()
        y = positions(*to_canonical(target, self.stitch.dst)).double().cpu()
        x = torch.cat([x, torch.ones(len(x), 1, dtype=torch.float64)], dim=1)
        self.xtx += x.T @ x
        self.xty += x.T @ y

    @torch.no_grad()
    def solve(self) -> None:
        """Pseudo-inverse solution with a bias column, written into the stitch layer."""
        solution = torch.linalg.pinv(self.xtx, hermitian=True) @ self.xty
        weight, bias = solution[:-1].T, solution[-1]
        self.stitch.weight.copy_(weight.to(self.stitch.weight))
        self.stitch.bias.copy_(bias.to(self.stitch.bias))
