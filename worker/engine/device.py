"""Device choice and the cheap numeric wins that keep results within tolerance of fp32."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch


def pick_device(requested: str) -> torch.device:
    """'auto' takes the GPU the environment grants (CUDA_VISIBLE_DEVICES), else the CPU."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device(requested)


def bf16_enabled(device: torch.device) -> bool:
    # IRI synthesis follows the sign of a gradient, which bf16 leaves intact; opt out with
    # STITCHSIM_BF16=0 where a model proves sensitive.
    return device.type == "cuda" and os.environ.get("STITCHSIM_BF16", "1") != "0"


@contextlib.contextmanager
def autocast(device: torch.device) -> Iterator[None]:
    if bf16_enabled(device):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            yield
    else:
        yield
