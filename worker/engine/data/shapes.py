"""A built-in second task that shares nothing with digits: ten classes of geometric shapes,
generated on the fly (no download), for cross-task pairing ("Functional Alignment Can
Mislead" stitches models of unrelated tasks and finds high accuracy: compatibility, not
shared meaning).

Each image is one shape in a random bright colour, at a random place and size, on a dark,
noisy background; the class is the shape alone.
"""

from __future__ import annotations

import torch

SIZE = 32
CLASSES = (
    "disc", "ring", "square", "frame", "triangle",
    "plus", "cross", "horizontal bars", "vertical bars", "checkerboard",
)  # fmt: skip


def _masks(cls: torch.Tensor, cx: torch.Tensor, cy: torch.Tensor, r: torch.Tensor
           ) -> torch.Tensor:
    """(N, SIZE, SIZE) boolean masks of each sample's shape."""
    coords = torch.arange(SIZE, dtype=torch.float32)
    y, x = coords.view(1, -1, 1), coords.view(1, 1, -1)
    dx, dy = x - cx.view(-1, 1, 1), y - cy.view(-1, 1, 1)
    r = r.view(-1, 1, 1)
    dist = torch.sqrt(dx**2 + dy**2)
    inside = (dx.abs() <= r) & (dy.abs() <= r)
    thick = (r / 3).clamp_min(1.5)
    stripes = torch.stack([
        dist <= r,                                                  # disc
        (dist <= r) & (dist >= r - thick),                          # ring
        inside,                                                     # square
        inside & ((dx.abs() >= r - thick) | (dy.abs() >= r - thick)),  # frame
        (dy <= r) & (dy >= -r) & (dx.abs() <= (dy + r) / 2),        # triangle, apex up
        inside & ((dx.abs() <= thick / 2 + 0.5) | (dy.abs() <= thick / 2 + 0.5)),  # plus
        inside & (((dx - dy).abs() <= thick) | ((dx + dy).abs() <= thick)),        # cross
        inside & (torch.remainder(torch.floor(dy / thick), 2) == 0),  # horizontal bars
        inside & (torch.remainder(torch.floor(dx / thick), 2) == 0),  # vertical bars
        inside & (torch.remainder(torch.floor(dx / thick) + torch.floor(dy / thick), 2) == 0),
    ], dim=1)  # fmt: skip
    return stripes[torch.arange(len(cls)), cls]


def make_shapes(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n images (N, 3, 32, 32) in [0,1] with balanced labels, deterministic for a seed."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % len(CLASSES)
    labels = labels[torch.randperm(n, generator=g)]
    r = 5 + 4 * torch.rand(n, generator=g)
    margin = r + 1
    cx = margin + torch.rand(n, generator=g) * (SIZE - 1 - 2 * margin)
    cy = margin + torch.rand(n, generator=g) * (SIZE - 1 - 2 * margin)
    mask = _masks(labels, cx, cy, r).unsqueeze(1).float()
    colour = 0.35 + 0.65 * torch.rand((n, 3), generator=g)
    background = 0.15 * torch.rand((n, 3, 1, 1), generator=g)
    noise = 0.05 * torch.randn((n, 3, SIZE, SIZE), generator=g)
    images = background + mask * (colour.view(n, 3, 1, 1) - background) + noise
    return images.clamp(0, 1), labels
