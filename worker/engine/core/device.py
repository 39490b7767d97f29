"""Device choice and the cheap numeric wins that keep results within tolerance of fp32."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
from stitchsim.failure import Failure


def pick_device(requested: str) -> torch.device:
    """'auto' takes the GPU the environment grants (CUDA_VISIBLE_DEVICES), else the CPU. A
    device asked for by name must exist here: a job that silently ran on the CPU instead of
    `cuda:1` would be slow and wrongly labelled, so it is refused with what there is."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type != "cuda":
        return device
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = 0 if device.index is None else device.index
    if index >= count:
        have = ", ".join(["cpu"] + [f"cuda:{i}" for i in range(count)])
        raise Failure(
            "device_unavailable",
            f"device {requested!r} is not available on this service's workers "
            f"(they have: {have}); use \"auto\" to take what a worker has",
            {"available": have.split(", ")},
        )
    return device


def bf16_enabled(device: torch.device, asked: bool) -> bool:
    """bf16 autocast where the job asked for it (iri.precision), on CUDA only (CPU autocast is
    slower than fp32 there), unless the operator turned it off (STITCHSIM_BF16=0). The default
    is fp32, as the paper runs: bf16 keeps a gradient's sign mostly, but no GPU run has yet
    shown equal figures (docs/method.md)."""
    return asked and device.type == "cuda" and os.environ.get("STITCHSIM_BF16", "1") != "0"


@contextlib.contextmanager
def autocast(device: torch.device, bf16: bool) -> Iterator[None]:
    if bf16_enabled(device, bf16):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            yield
    else:
        yield
