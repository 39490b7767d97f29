"""The convolutional autoencoder of "Functional Alignment Can Mislead"'s encoder -> decoder
experiment, registered among the project's own architectures (builtin.py, the `stitchsim`
model source).

Until that source is merged the architecture is also named in timm's registry
(`_expose_to_timm`), so a checkpoint whose metadata says `arch: conv_autoencoder` builds
through the timm path; the bridge goes when the source reads builtin.py.
"""

from __future__ import annotations

from typing import Any

import torch
from stitchsim_worker.engine.models.builtin import Builder, register_architecture
from torch import nn

AUTOENCODER = "conv_autoencoder"


class ConvAutoencoder(nn.Module):
    """A small convolutional autoencoder for 3 x 32 x 32 images in [0, 1]: an encoder to a
    `latent` x 8 x 8 code (the stitch point `encoder`) and a decoder back to pixels."""

    num_classes = 0  # no classifier head: its output is an image

    def __init__(self, width: int = 8, latent: int = 8) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv2d(3, width, 3, stride=2, padding=1), nn.ReLU(),  # 16 x 16
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.ReLU(),  # 8 x 8
            nn.Conv2d(2 * width, latent, 3, padding=1),
        )
        self.decoder = nn.Sequential(
            nn.ReLU(),
            nn.ConvTranspose2d(latent, 2 * width, 4, stride=2, padding=1), nn.ReLU(),
            nn.ConvTranspose2d(2 * width, width, 4, stride=2, padding=1), nn.ReLU(),
            # A linear output: a sigmoid saturates on sparse images (shapes on black) and
            # the training collapses to drawing the background.
            nn.Conv2d(width, 3, 3, padding=1),
        )
        # The points a stitch reads, for the stage list: the code and the decoder's middle.
        self.feature_info = [{"module": "encoder.1"}, {"module": "encoder"},
                             {"module": "decoder.2"}, {"module": "decoder.4"}]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(x))


def _expose_to_timm(name: str, builder: Builder) -> None:
    from timm.models import register_model

    def create(pretrained: bool = False, **kwargs: Any) -> nn.Module:
        if pretrained:
            raise ValueError(f"{name} has no pretrained weights")
        for key in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"):
            kwargs.pop(key, None)  # timm passes its own config entries
        return builder(**kwargs)

    create.__name__ = name
    create.__module__ = __name__
    register_model(create)


register_architecture(AUTOENCODER, ConvAutoencoder)
_expose_to_timm(AUTOENCODER, ConvAutoencoder)
