"""Image grids: what an image model's stitch draws, beside its inputs and the back model's own
outputs (the autoencoder experiment of "Functional Alignment Can Mislead": a user sees shapes
drawn as digits). One PNG per grid, base64 in the report; the page shows it as it is."""

from __future__ import annotations

import base64
import io

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from stitchsim.models import ImageGrid
from stitchsim_worker.engine.core.context import Cut
from stitchsim_worker.engine.stitching.activations import Split

GRID_SAMPLES = 8
_PAD = 2


def _displayable(images: torch.Tensor, size: int) -> torch.Tensor:
    """N x 3 x size x size in [0, 1]: grey or RGB, resized; a row outside [0, 1] (an
    image-to-image model with other units) is stretched to its own range."""
    x = images.float().cpu()
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    elif x.shape[1] != 3:
        x = x.mean(1, keepdim=True).expand(-1, 3, -1, -1)
    if x.shape[-1] != size or x.shape[-2] != size:
        x = F.interpolate(x, size=(size, size), mode="nearest")
    lo, hi = float(x.min()), float(x.max())
    if lo < 0 or hi > 1:
        x = (x - lo) / max(hi - lo, 1e-12)
    return x.clamp(0, 1)


def grid_png(rows: list[torch.Tensor]) -> tuple[str, int, int]:
    """Rows of N x C x H x W images as one PNG (white gaps between tiles): base64, width,
    height."""
    size = int(rows[0].shape[-1])
    tiles = [_displayable(r, size) for r in rows]
    n = max(len(t) for t in tiles)
    step = size + _PAD
    canvas = np.ones((len(tiles) * step - _PAD, n * step - _PAD, 3), dtype=np.float32)
    for r, row in enumerate(tiles):
        for c, img in enumerate(row):
            canvas[r * step : r * step + size, c * step : c * step + size] = (
                img.permute(1, 2, 0).numpy())
    buf = io.BytesIO()
    Image.fromarray((canvas * 255).round().astype(np.uint8)).save(buf, format="PNG")
    height, width = canvas.shape[:2]
    return base64.b64encode(buf.getvalue()).decode("ascii"), width, height


@torch.no_grad()
def image_grid(cut: Cut, test: Split, stitched: torch.Tensor) -> ImageGrid:
    """The first test samples: the inputs the front part saw, the back model's outputs on
    them, the target when it is another image's (cross-task pairing), the stitched model's."""
    k = min(GRID_SAMPLES, len(test))
    shown = test.front_pixels if test.front_pixels is not None else test.pixels
    assert shown is not None, "a test split keeps its images"
    inputs = shown[0:k]
    back = cut.g.logits(inputs.to(cut.g.device)).float().cpu()
    labels, rows = ["inputs", f"back model ({cut.g.where}) on the inputs"], [inputs, back]
    if test.front_pixels is not None:
        labels.append(f"back model ({cut.g.where}) on an image of the paired class: the target")
        rows.append(test.back_logits[0:k])
    labels.append("stitched model on the inputs")
    rows.append(stitched[:k])
    png, width, height = grid_png(rows)
    return ImageGrid(labels=labels, samples=k, width=width, height=height, png=png)
