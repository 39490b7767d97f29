"""Tiny models of every source, random weights, saved the way their libraries save them: a
torchvision state dict as safetensors with its arch, transformers' save_pretrained folder,
timm's hub-layout folder. Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from stitchsim.files.folder import pack_model_folder
from stitchsim_worker.engine.models.loading import save_checkpoint

VIT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
       "intermediate_size": 64, "image_size": 32, "patch_size": 8, "num_labels": 10}
# Embedders: pooled output (the CLS token after the last norm), no classifier head.
DINOV2 = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
          "intermediate_size": 64, "image_size": 32, "patch_size": 8}
CLIP_VISION = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
               "intermediate_size": 64, "image_size": 32, "patch_size": 8}
CONVNEXT = {"hidden_sizes": [8, 16], "depths": [1, 1], "num_stages": 2, "num_labels": 10,
            "image_size": 32}


def torchvision_file(tmp: Path, name: str, seed: int = 0) -> Path:
    from torchvision import models

    torch.manual_seed(seed)
    net = models.get_model(name, weights=None, num_classes=10)
    path = tmp / f"{name}.safetensors"
    save_checkpoint(net, path, f"torchvision:{name}", {"num_classes": 10})
    return path


def hf_folder(tmp: Path, cls: str, fields: dict[str, Any], *, processor: bool = False,
              seed: int = 0) -> Path:
    import transformers

    torch.manual_seed(seed)
    model_cls = getattr(transformers, cls)
    net = model_cls(model_cls.config_class(**fields))
    folder = tmp / f"{cls}-{seed}"
    net.save_pretrained(folder)
    if processor:
        transformers.ViTImageProcessor(image_mean=[0.5, 0.4, 0.3], image_std=[0.2, 0.2, 0.2],
                                       size={"height": 32, "width": 32}
                                       ).save_pretrained(folder)
    return folder


def timm_hub_folder(tmp: Path, arch: str = "test_resnet", seed: int = 0) -> Path:
    import timm
    from timm.models._hub import save_for_hf

    torch.manual_seed(seed)
    net = timm.create_model(arch, pretrained=False, num_classes=10)
    folder = tmp / f"{arch}-hub-{seed}"
    save_for_hf(net, str(folder), safe_serialization=True,
                data_config={"mean": (0.3, 0.3, 0.3), "std": (0.2, 0.2, 0.2)})
    return folder


def packed(folder: Path) -> Path:
    """The file the SDK uploads for a folder."""
    out = folder.with_suffix(".safetensors")
    pack_model_folder(folder, out)
    return out
