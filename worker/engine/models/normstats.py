"""A label-free judge of preprocessing: how well a candidate's inputs match what the model's
first normalisation layer saw in training.

A BatchNorm layer keeps the running mean and variance of its inputs over training. Fed inputs
preprocessed as in training, a batch's per-channel statistics at that layer come close to
those; preprocessed otherwise (ImageNet mean/std for a model trained on [0,1] pixels scales
the first convolution's output about four-fold), they do not. The distance is the mean over
channels of KL(batch statistics || running statistics), both read as Gaussians. No labels, no
classifier head: it works for embedders, autoencoders, unlabelled data, and for models near
chance on the dataset by design.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase

# Decided: the runner-up's distance is at least this many times the best's, plus the floor
# (measured: the right candidate's distance is ~0.01-0.1, a wrong one's 0.5 and up).
DECISIVE_RATIO = 2.0
DECISIVE_GAP = 0.05


class _Stop(Exception):
    def __init__(self, value: torch.Tensor):
        self.value = value


def first_norm(net: nn.Module) -> _NormBase | None:
    """The first normalisation layer that keeps running statistics learnt in training."""
    for module in net.modules():
        if (isinstance(module, _NormBase) and module.track_running_stats
                and module.running_mean is not None and module.running_var is not None
                and not module.running_mean.is_meta):
            if _untouched(module):
                return None  # never trained (random init): its statistics say nothing
            return module
    return None


def _untouched(norm: _NormBase) -> bool:
    assert norm.running_mean is not None and norm.running_var is not None
    return bool(torch.all(norm.running_mean == 0) and torch.all(norm.running_var == 1))


@torch.no_grad()
def stats_distance(net: nn.Module, norm: _NormBase, inputs: torch.Tensor) -> float:
    """Mean over channels of KL(N(batch mean, batch var) || N(running mean, running var)) at
    the layer's input, for already preprocessed inputs."""

    def stop(_m: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        raise _Stop(args[0])

    handle = norm.register_forward_pre_hook(stop)
    try:
        net(inputs)
        return math.inf  # the layer never ran
    except _Stop as s:
        x = s.value.float()
    finally:
        handle.remove()
    dims = [d for d in range(x.dim()) if d != 1]
    mean, var = x.mean(dim=dims), x.var(dim=dims).clamp_min(1e-8)
    assert norm.running_mean is not None and norm.running_var is not None
    r_mean, r_var = norm.running_mean.float(), norm.running_var.float().clamp_min(1e-8)
    kl = 0.5 * (torch.log(r_var / var) + (var + (mean - r_mean) ** 2) / r_var - 1)
    return float(kl.mean())


def decisive(distances: list[float]) -> int | None:
    """The index of the clearly closest candidate, or None when none stands out."""
    finite = [d for d in distances if math.isfinite(d)]
    if len(finite) < 2:
        return None
    order = sorted(range(len(distances)), key=distances.__getitem__)
    best, second = distances[order[0]], distances[order[1]]
    return order[0] if second >= DECISIVE_RATIO * best + DECISIVE_GAP else None
