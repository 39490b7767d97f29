"""Adversarially robust reference models, so users (and the adversarial-stitching test and
demo) have a robust model to compare without downloading one. Training is "fast" adversarial
training (Wong et al. 2020): one FGSM step from a random start per batch, in [0,1] pixels,
which on the built-in digits reaches PGD-10 robust accuracy close to the clean one in a few
epochs on a CPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import timm
import torch
import torch.nn.functional as F
from stitchsim.catalogue import resolution_of
from stitchsim.models import AdversarialSettings
from stitchsim_worker.engine.data.datasets import builtin
from stitchsim_worker.engine.models.attacks import pgd
from stitchsim_worker.engine.models.loading import save_checkpoint
from stitchsim_worker.engine.models.zoo import Perturb, train_classifier

EPSILON = 8 / 255


def fgsm_random_start(epsilon: float, seed: int) -> Perturb:
    g = torch.Generator().manual_seed(seed)
    step = 1.25 * epsilon  # the step size of fast adversarial training

    def perturb(model: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        delta = (torch.rand(x.shape, generator=g) * 2 - 1) * epsilon
        x_start = (x + delta).clamp(0, 1).requires_grad_(True)
        (grad,) = torch.autograd.grad(F.cross_entropy(model(x_start), y), x_start)
        x_adv = x_start.detach() + step * grad.sign()
        return torch.minimum(torch.maximum(x_adv, x - epsilon), x + epsilon).clamp(0, 1)

    return perturb


def robust_accuracy(
    net: torch.nn.Module, dataset: str, settings: AdversarialSettings | None = None,
    limit: int = 400,
) -> float:
    """Accuracy under PGD (the service's defaults at the set's resolution: at 32 px eps 8/255,
    10 steps of 2/255) on the first `limit` test samples of a built-in set."""
    ds = builtin(dataset)
    settings = (settings or AdversarialSettings()).at(resolution_of(ds.shorter_side))
    cfg = timm.data.resolve_data_config({}, model=net)
    mean = torch.tensor(cfg["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(cfg["std"]).view(1, 3, 1, 1)
    x, y = ds.test.images[:limit], ds.test.labels[:limit]

    def model(p: torch.Tensor) -> torch.Tensor:
        return net((p - mean) / std)

    x_adv = pgd(lambda p: F.cross_entropy(model(p), y, reduction="sum"), x, settings)
    with torch.no_grad():
        return float((model(x_adv).argmax(-1) == y).float().mean())


def make_robust_checkpoint(
    path: Path, arch: str, dataset: str = "digits", *, seed: int = 0, epochs: int = 8,
    lr: float = 0.01, epsilon: float = EPSILON,
) -> tuple[float, float]:
    """Train adversarially and save with arch metadata; returns (clean, robust) accuracy."""
    arch_kwargs = {"num_classes": 10}
    net, clean = train_classifier(arch, dataset, arch_kwargs=arch_kwargs, epochs=epochs,
                                  seed=seed, lr=lr, perturb=fgsm_random_start(epsilon, seed))
    robust = robust_accuracy(net, dataset)
    save_checkpoint(net, path, arch, arch_kwargs)
    path.with_suffix(".json").write_text(json.dumps({
        "arch": arch, "dataset": dataset, "test_accuracy": clean,
        "robust_accuracy": robust, "adversarial_training": {"epsilon": epsilon},
    }))
    return clean, robust
