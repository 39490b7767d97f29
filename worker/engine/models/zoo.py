"""Small reference models trained on built-in data: demos, tests and benchmarks use them, since
nothing may download weights."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import timm
import torch
import torch.nn.functional as F
from stitchsim_worker.engine.data.datasets import builtin
from stitchsim_worker.engine.models.autoencoder import AUTOENCODER, ConvAutoencoder
from stitchsim_worker.engine.models.loading import save_checkpoint

# (model on pixels, pixels, labels) -> pixels to train on
Perturb = Callable[[Callable[[torch.Tensor], torch.Tensor], torch.Tensor, torch.Tensor],
                   torch.Tensor]


def train_classifier(
    arch: str,
    dataset: str = "digits",
    *,
    arch_kwargs: dict[str, Any] | None = None,
    epochs: int = 8,
    seed: int = 0,
    lr: float = 3e-3,
    batch_size: int = 64,
    perturb: Perturb | None = None,
    on_epoch: Callable[[int, int, float], None] | None = None,
) -> tuple[torch.nn.Module, float]:
    """Train from scratch on a built-in set; returns the model (eval mode) and test accuracy.
    `perturb` replaces each training batch (in pixels) before the step: adversarial training.
    `on_epoch(epoch, epochs, mean loss)` after each epoch: training takes minutes on a CPU, and
    a caller that shows nothing for that long looks hung."""
    kwargs = {"num_classes": 10, **(arch_kwargs or {})}
    torch.manual_seed(seed)
    net = timm.create_model(arch, pretrained=False, **kwargs)
    ds = builtin(dataset)
    cfg = timm.data.resolve_data_config({}, model=net)
    mean = torch.tensor(cfg["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(cfg["std"]).view(1, 3, 1, 1)
    pixels, y = ds.train.images, ds.train.labels
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=1e-4)
    steps = epochs * ((len(y) + batch_size - 1) // batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps)
    g = torch.Generator().manual_seed(seed)
    net.train()
    for epoch in range(epochs):
        losses = []
        for idx in torch.randperm(len(y), generator=g).split(batch_size):
            batch = pixels[idx]
            if perturb is not None:
                batch = perturb(lambda p: net((p - mean) / std), batch, y[idx])
            loss = F.cross_entropy(net((batch - mean) / std), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
        if on_epoch is not None:
            on_epoch(epoch + 1, epochs, sum(losses) / len(losses))
    net.eval()
    return net, classifier_accuracy(net, dataset)


def classifier_accuracy(net: torch.nn.Module, dataset: str) -> float:
    """Test accuracy of a classifier in eval mode, on timm's preprocessing of its config."""
    cfg = timm.data.resolve_data_config({}, model=net)
    mean = torch.tensor(cfg["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(cfg["std"]).view(1, 3, 1, 1)
    test = builtin(dataset).test
    with torch.no_grad():
        pred = net((test.images - mean) / std).argmax(-1)
    return float((pred == test.labels).float().mean())


def make_checkpoint(path: Path, arch: str, dataset: str = "digits", *,
                    dtype: torch.dtype | None = None, **kwargs: Any) -> float:
    """Train and save as a user would upload it: safetensors with arch metadata; `dtype`
    stores the floating tensors at that precision (float16: half the file, for checkpoints
    committed to the repository). The accuracy is the stored model's."""
    arch_kwargs = {"num_classes": 10, **kwargs.pop("arch_kwargs", {})}
    net, acc = train_classifier(arch, dataset, arch_kwargs=arch_kwargs, **kwargs)
    if dtype is not None:  # the figures must be those of the weights a user will load
        net = net.to(dtype).float()
        acc = classifier_accuracy(net, dataset)
    save_checkpoint(net, path, arch, arch_kwargs, dtype=dtype)
    path.with_suffix(".json").write_text(
        json.dumps({"arch": arch, "dataset": dataset, "test_accuracy": acc})
    )
    return acc


def train_autoencoder(
    dataset: str = "digits", *, arch_kwargs: dict[str, Any] | None = None, epochs: int = 15,
    seed: int = 0, lr: float = 3e-3, batch_size: int = 64,
) -> tuple[torch.nn.Module, float]:
    """The conv autoencoder trained from scratch to reconstruct a built-in set's images (plain
    [0,1] pixels in and out); returns the model (eval mode) and its test relative error."""
    torch.manual_seed(seed)
    net = ConvAutoencoder(**(arch_kwargs or {}))
    pixels = builtin(dataset).train.images
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=1e-4)
    steps = epochs * ((len(pixels) + batch_size - 1) // batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps)
    g = torch.Generator().manual_seed(seed)
    net.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(pixels), generator=g).split(batch_size):
            loss = F.mse_loss(net(pixels[idx]), pixels[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    net.eval()
    test = builtin(dataset).test.images
    with torch.no_grad():
        error = torch.linalg.vector_norm(net(test) - test) / torch.linalg.vector_norm(test)
    return net, float(error)


def make_autoencoder_checkpoint(path: Path, dataset: str = "digits", **kwargs: Any) -> float:
    """Train the autoencoder and save it as a user would: safetensors whose metadata names the
    architecture, its plain-pixel preprocessing and its output kind."""
    arch_kwargs = kwargs.pop("arch_kwargs", {})
    net, error = train_autoencoder(dataset, arch_kwargs=arch_kwargs, **kwargs)
    save_checkpoint(net, path, AUTOENCODER, arch_kwargs, preprocess="none", output="image")
    path.with_suffix(".json").write_text(
        json.dumps({"arch": AUTOENCODER, "dataset": dataset, "test_relative_error": error})
    )
    return error
