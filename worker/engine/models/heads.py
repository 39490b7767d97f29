"""The number of classes a checkpoint's classifier head has, read from its weights.

A state dict saved from `torchvision.models.resnet18(num_classes=10)` or a fine-tuned timm model
carries no kwargs; built with the architecture's defaults it has a 1000-class head and does not
fit. When the only keys that differ are one linear head's weight and bias, and they differ only
in their number of rows, the checkpoint says its class count and nobody should have to repeat
it as `arch_kwargs`."""

from __future__ import annotations

from torch import nn

Shapes = dict[str, tuple[int, ...]]


def head_classes(net: nn.Module, ckpt: Shapes) -> int | None:
    """The checkpoint's class count when its head alone differs from the model's, else None."""
    model = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    if set(model) != set(ckpt):
        return None
    differ = {k for k in model if model[k] != ckpt[k]}
    for name, module in net.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        head = {f"{name}.weight"} | ({f"{name}.bias"} if module.bias is not None else set())
        if differ != head:
            continue
        rows = {ckpt[k][0] for k in head}
        same_inputs = ckpt[f"{name}.weight"][1:] == model[f"{name}.weight"][1:]
        return rows.pop() if len(rows) == 1 and same_inputs else None
    return None
