"""PGD in [0,1] pixel space (L-inf), as the invariance-aware paper's code runs it: fixed
steps of the gradient's sign, projected onto the epsilon ball around x and the pixel range,
no random start unless asked. Models apply their own preprocessing on the way in, so the
budget is in pixel units whatever each model's normalisation."""

from __future__ import annotations

from collections.abc import Callable

import torch
from stitchsim.models import AdversarialSettings


def pgd(
    loss: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    settings: AdversarialSettings,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Inputs within settings.epsilon of x that increase loss(x_adv) (a scalar, summed over
    the batch so every sample gets its own gradient)."""
    eps = settings.epsilon
    x = x.detach()
    x_adv = x.clone()
    if settings.random_start:
        noise = torch.rand(x.shape, generator=generator).to(x) * 2 - 1
        x_adv = (x + eps * noise).clamp(0, 1)
    for _ in range(settings.steps):
        x_adv.requires_grad_(True)
        (grad,) = torch.autograd.grad(loss(x_adv), x_adv)
        with torch.no_grad():
            x_adv = x_adv + settings.step_size * grad.sign()
            x_adv = torch.minimum(torch.maximum(x_adv, x - eps), x + eps).clamp(0, 1)
    return x_adv.detach()
