"""The convolutional autoencoder of "Functional Alignment Can Mislead"'s encoder -> decoder
experiment, registered among the project's own architectures (builtin.py): the `stitchsim`
model source builds it as `stitchsim:conv_autoencoder`. Checkpoints saved before the source
existed say `arch: conv_autoencoder`; that plain name still reaches it (models.sources:
a plain name timm does not know falls to the project's own)."""

from __future__ import annotations

import torch
from stitchsim_worker.engine.models.builtin import register_architecture
from torch import nn

NAME = "conv_autoencoder"
AUTOENCODER = f"stitchsim:{NAME}"
"""The arch its checkpoints name."""


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


register_architecture(NAME, ConvAutoencoder)
