"""The unseen-cue suite: class markers neither model saw in training, painted onto the inputs
the stitch is trained on. A stitch that reads the marker agrees with the back model for the
wrong reason; rolling the markers by one class at test time exposes it (excessive agreement).

Three cues, one registered entry each: a class-coloured square at a class-specific place
(`pixel_specific`), the same colours at a random place (`pixel_rand`), and random colours at
random places (`rand_rand`, which carries no class information: the control that should give
an excessive agreement of about zero). Colours are far apart in RGB (farthest-point sampling).
What a cue is called is its catalogue entry's (stitchsim.catalogue.CUES); adding one is its
catalogue entry plus one `register_cue` call here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch
from stitchsim_worker.engine.core.registry import Registry

# Marks `images` for `classes` (the label, or the label rolled by one class).
MarkFn = Callable[[torch.Tensor, torch.Tensor, int, int, torch.Generator], torch.Tensor]


@dataclass(frozen=True)
class Cue:
    name: str
    mark: MarkFn
    """(images, classes, n_classes, marker side, generator) -> marked copy of images."""


CUE_IMPLS: Registry[Cue] = Registry("cue")
register_cue = CUE_IMPLS.register


@lru_cache(maxsize=8)
def palette(k: int) -> torch.Tensor:
    """k colours (k, 3) in [0,1], each as far as possible from those before it (greedy
    farthest-point sampling over a 6x6x6 RGB grid, starting from pure red)."""
    levels = torch.linspace(0, 1, 6)
    grid = torch.cartesian_prod(levels, levels, levels)
    chosen = [int(((grid - torch.tensor([1.0, 0.0, 0.0])) ** 2).sum(1).argmin())]
    nearest = ((grid - grid[chosen[0]]) ** 2).sum(1)
    while len(chosen) < k:
        nxt = int(nearest.argmax())
        chosen.append(nxt)
        nearest = torch.minimum(nearest, ((grid - grid[nxt]) ** 2).sum(1))
    return grid[chosen]


def class_places(k: int, size: int, side: int) -> torch.Tensor:
    """(k, 2) top-left corners: distinct places around the border, clockwise from the top
    left, so markers stay clear of a centred object."""
    last = size - side
    steps = max(1, -(-k // 4))  # places per edge
    offsets = [round(t * last / steps) for t in range(steps)]
    ring = ([(0, c) for c in offsets] + [(r, last) for r in offsets]
            + [(last, last - c) for c in offsets] + [(last - r, 0) for r in offsets])
    return torch.tensor(ring[:k])


def _paint(images: torch.Tensor, colours: torch.Tensor, places: torch.Tensor, side: int
           ) -> torch.Tensor:
    out = images.clone()
    for n in range(len(out)):
        r, c = int(places[n, 0]), int(places[n, 1])
        out[n, :, r : r + side, c : c + side] = colours[n].view(3, 1, 1)
    return out


def _random_places(n: int, size: int, side: int, g: torch.Generator) -> torch.Tensor:
    return torch.randint(0, size - side + 1, (n, 2), generator=g)


def _pixel_specific(
    images: torch.Tensor, classes: torch.Tensor, k: int, side: int, g: torch.Generator
) -> torch.Tensor:
    places = class_places(k, images.shape[-1], side)
    return _paint(images, palette(k)[classes], places[classes], side)


def _pixel_rand(
    images: torch.Tensor, classes: torch.Tensor, k: int, side: int, g: torch.Generator
) -> torch.Tensor:
    places = _random_places(len(images), images.shape[-1], side, g)
    return _paint(images, palette(k)[classes], places, side)


def _rand_rand(
    images: torch.Tensor, classes: torch.Tensor, k: int, side: int, g: torch.Generator
) -> torch.Tensor:
    colours = torch.rand((len(images), 3), generator=g)
    places = _random_places(len(images), images.shape[-1], side, g)
    return _paint(images, colours, places, side)


register_cue(Cue(name="pixel_specific", mark=_pixel_specific))
register_cue(Cue(name="pixel_rand", mark=_pixel_rand))
register_cue(Cue(name="rand_rand", mark=_rand_rand))
