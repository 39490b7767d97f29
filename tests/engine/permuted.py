"""A trained model's channel-permuted copy: the same function, other tensors."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file


def permuted_copy(src: Path, dst: Path) -> Path:
    """test_resnet with the channels of layer4's residual stream and of its block's inner
    map permuted (the head reads them permuted): the same function, other tensors at layer4."""
    with safe_open(str(src), "pt") as f:
        weights = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - not a dict
        meta = f.metadata()
    gen = torch.Generator().manual_seed(0)
    inner = torch.randperm(weights["layer4.0.conv1.weight"].shape[0], generator=gen)
    out = torch.randperm(weights["layer4.0.conv2.weight"].shape[0], generator=gen)
    for k in list(weights):
        if k.startswith(("layer4.0.conv1.", "layer4.0.bn1.")) and weights[k].dim():
            weights[k] = weights[k][inner]
        if k.startswith(("layer4.0.conv2.", "layer4.0.bn2.", "layer4.0.downsample.1.",
                         "layer4.0.downsample.2.")) and weights[k].dim():
            weights[k] = weights[k][out]
    weights["layer4.0.conv2.weight"] = weights["layer4.0.conv2.weight"][:, inner]
    weights["fc.weight"] = weights["fc.weight"][:, out]
    save_file({k: v.contiguous() for k, v in weights.items()}, str(dst), metadata=meta)
    dst.with_suffix(".json").write_text(json.dumps({"permuted": str(src)}))
    return dst
