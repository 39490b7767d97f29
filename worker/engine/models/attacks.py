"""Attacks in [0,1] pixel space (L-inf). Models apply their own preprocessing on the way in,
so the budget is in pixel units whatever each model's normalisation.

`pgd` is PGD as the invariance-aware paper's code runs it in stitch training: fixed steps of
the gradient's sign, projected onto the epsilon ball around x and the pixel range, no random
start unless asked. The robust evaluation's attacks are registered by their catalogue names
(stitchsim.catalogue.ATTACKS): `autoattack_paper` (APGD-CE then APGD-DLR as the paper's code
runs them: ART's AutoAttack and AutoProjectedGradientDescent), `apgd` (the same two losses as
Croce & Hein's reference code runs them) and `pgd` (PGD-k)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from stitchsim.models import AdversarialSettings
from stitchsim_worker.engine.core.registry import Registry

Model = Callable[[torch.Tensor], torch.Tensor]
"""Pixels in [0,1] -> logits."""


def pgd(
    loss: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    settings: AdversarialSettings,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Inputs within settings.epsilon of x that increase loss(x_adv) (a scalar, summed over
    the batch so every sample gets its own gradient)."""
    eps, step = settings.pgd_epsilon(), settings.pgd_step_size()
    x = x.detach()
    x_adv = x.clone()
    if settings.random_start:
        noise = torch.rand(x.shape, generator=generator).to(x) * 2 - 1
        x_adv = (x + eps * noise).clamp(0, 1)
    for _ in range(settings.steps):
        x_adv.requires_grad_(True)
        (grad,) = torch.autograd.grad(loss(x_adv), x_adv)
        with torch.no_grad():
            x_adv = x_adv + step * grad.sign()
            x_adv = _project(x_adv, x, eps)
    return x_adv.detach()


def _project(z: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.minimum(torch.maximum(z, x - eps), x + eps).clamp(0, 1)


def dlr_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Croce & Hein's difference of logits ratio, per sample (untargeted): invariant to the
    logits' shift and scale, so it does not saturate as cross-entropy does."""
    z, _ = logits.sort(dim=1)
    true = logits.gather(1, y[:, None])[:, 0]
    top_is_true = (logits.argmax(1) == y).float()
    other = z[:, -2] * top_is_true + z[:, -1] * (1 - top_is_true)
    return -(true - other) / (z[:, -1] - z[:, -3] + 1e-12)


LOSSES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "ce": lambda logits, y: F.cross_entropy(logits, y, reduction="none"),
    "dlr": dlr_loss,
}


def _oscillating(losses: torch.Tensor, i: int, k: int, rho: float) -> torch.Tensor:
    """Whether the loss rose in at most rho * k of the last k steps (per sample). Indices wrap
    as in the reference code, whose first check compares the first step with the zeros
    of the not-yet-written last row."""
    steps = losses.shape[0]
    rises = sum((losses[(i - c) % steps] > losses[(i - c - 1) % steps]).float()
                for c in range(k))
    return rises <= k * rho


def apgd(
    model: Model, x: torch.Tensor, y: torch.Tensor, *, eps: float, steps: int, loss: str = "ce",
    rho: float = 0.75, generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Auto-PGD, L-inf (Croce & Hein 2020, Algorithm 1): a step of 2 eps halved per sample at
    checkpoints where the loss oscillated or stopped improving (restarting from the best
    point), with momentum 0.75. Returns the inputs (the last fooling iterate where one fooled
    the model, else the highest-loss one) and which inputs fooled it."""
    criterion, n = LOSSES[loss], len(x)
    k, k_min, decrease = max(int(0.22 * steps), 1), max(int(0.06 * steps), 1), \
        max(int(0.03 * steps), 1)
    x = x.detach()
    t = (torch.rand(x.shape, generator=generator) * 2 - 1).to(x)
    x_adv = (x + eps * t / t.flatten(1).abs().amax(1).view(-1, *[1] * (x.dim() - 1))).clamp(0, 1)

    def loss_grad(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        z = z.clone().requires_grad_(True)
        logits = model(z)
        values = criterion(logits, y)
        (grad,) = torch.autograd.grad(values.sum(), z)
        return values.detach(), grad.detach(), logits.argmax(1).detach() != y

    shape = (n, *[1] * (x.dim() - 1))
    step = torch.full(shape, 2 * eps, device=x.device, dtype=x.dtype)
    values, grad, fooled = loss_grad(x_adv)
    x_fool, x_best, grad_best, best = x_adv.clone(), x_adv.clone(), grad.clone(), values.clone()
    history = torch.zeros(steps, n, device=x.device)
    best_at_check, reduced_at_check = best.clone(), torch.ones(n, dtype=torch.bool,
                                                               device=x.device)
    x_prev, since_check = x_adv.clone(), 0
    for i in range(steps):
        with torch.no_grad():
            a = 0.75 if i > 0 else 1.0
            z = _project(x_adv + step * grad.sign(), x, eps)
            x_adv, x_prev = _project(x_adv + (z - x_adv) * a + (x_adv - x_prev) * (1 - a),
                                     x, eps), x_adv
        values, grad, now = loss_grad(x_adv)
        fooled |= now
        x_fool[now] = x_adv[now]
        history[i] = values
        better = values > best
        x_best[better], grad_best[better], best[better] = x_adv[better], grad[better], \
            values[better]
        since_check += 1
        if since_check == k:
            stalled = ~reduced_at_check & (best_at_check >= best)
            reduce = _oscillating(history, i, k, rho) | stalled
            reduced_at_check, best_at_check = reduce.clone(), best.clone()
            step[reduce] /= 2
            x_adv[reduce], grad[reduce] = x_best[reduce], grad_best[reduce]
            since_check, k = 0, max(k - decrease, k_min)
    return torch.where(fooled.view(shape), x_fool, x_best), fooled


PAPER_BATCH = 64
"""ART's batch_size in the paper's 32 px evaluation. It matters in one place: ART stops a
batch early when every loss in it is exactly zero."""


def art_checkpoints(steps: int) -> list[int]:
    """The iterations at which ART's APGD may halve a step: its w_j (0, 0.22, then gaps
    shrinking by 0.03 down to 0.06) times the iterations, rounded up, in ART's arithmetic."""
    w = [0.0, 0.22]
    while (nxt := w[-1] + max(w[-1] - w[-2] - 0.03, 0.06)) <= 1:
        w.append(nxt)
    return [math.ceil(p * steps) for p in w]


def apgd_paper(
    model: Model, x: torch.Tensor, y: torch.Tensor, *, eps: float, step: float, steps: int,
    loss: str = "ce", generator: torch.Generator | None = None, batch: int = PAPER_BATCH,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Auto-PGD as ART's AutoProjectedGradientDescent runs it (L-inf, untargeted, one random
    init), the attack the paper's evaluation calls. Where it departs from Croce & Hein's
    reference (`apgd`): the first step is `step`, not 2 eps; the start is uniform noise in the
    eps ball; each step's gradient is taken at the current point; the result is the last
    iterate where that fools the model, else the random start. Returns (inputs, whether each
    fools the model)."""
    x = x.detach()
    noise = (torch.rand(x.shape, generator=generator) * 2 - 1).to(x) * eps
    start = _project(x + noise, x, eps)
    out = start.clone()
    for chunk in torch.arange(len(x), device=x.device).split(batch):
        out[chunk] = _apgd_paper_batch(model, x[chunk], start[chunk], y[chunk], step, steps,
                                       LOSSES[loss], eps)
    with torch.no_grad():
        fooled = model(out).argmax(1) != y
    return out, fooled


def _apgd_paper_batch(
    model: Model, x: torch.Tensor, start: torch.Tensor, y: torch.Tensor, step: float,
    steps: int, criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], eps: float,
) -> torch.Tensor:
    """One of ART's batches: the last iterate where it fools the model, else the start."""
    def loss_grad(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = z.clone().requires_grad_(True)
        values = criterion(model(z), y)
        (grad,) = torch.autograd.grad(values.sum(), z)
        return values.detach(), grad.detach()

    checks, n = art_checkpoints(steps), len(x)
    eta = torch.full((n, *[1] * (x.dim() - 1)), step, device=x.device, dtype=x.dtype)
    f_start, grad = loss_grad(start)
    x_k = _project(start + eta * grad.sign(), x, eps)
    f, grad_k = loss_grad(x_k)
    # The best point so far, the point before it, its loss and its gradient (ART keeps the
    # first two and recomputes the gradient; a model in eval mode gives the same one).
    up = f >= f_start
    x_max, x_max_prev = torch.where(_rows(up, x), x_k, start), x.clone()
    f_max, grad_max = torch.where(up, f, f_start), torch.where(_rows(up, x), grad_k, grad)
    count, eta_at_check, f_at_check = up.float(), eta.clone(), f_start.clone()
    x_prev, grad = start, grad_k
    for k in range(1, steps):
        with torch.no_grad():
            z = _project(x_k + eta * grad.sign(), x, eps)
            x_new = _project(x_k + 0.75 * (z - x_k) + 0.25 * (x_k - x_prev), x, eps)
        f, grad_new = loss_grad(x_new)
        if bool((f == 0).all()):
            return _fooling_or_start(model, x_new, start, y)
        up = f > f_max
        count += up.float()
        x_max, x_max_prev = torch.where(_rows(up, x), x_new, x_max), \
            torch.where(_rows(up, x), x_k, x_max_prev)
        f_max, grad_max = torch.where(up, f, f_max), torch.where(_rows(up, x), grad_new, grad_max)
        x_prev, x_k, grad = x_k, x_new, grad_new
        if k in checks:
            since = k - checks[checks.index(k) - 1]
            halve = (count < 0.75 * since) | ((eta_at_check == eta).flatten()
                                              & (f_at_check == f_max))
            eta = torch.where(_rows(halve, x), eta / 2, eta)
            x_k, x_prev = torch.where(_rows(halve, x), x_max, x_k), \
                torch.where(_rows(halve, x), x_max_prev, x_prev)
            grad = torch.where(_rows(halve, x), grad_max, grad)
            count, eta_at_check, f_at_check = torch.zeros_like(count), eta.clone(), f_max.clone()
    return _fooling_or_start(model, x_k, start, y)


def _rows(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-sample mask shaped to broadcast over the sample's pixels."""
    return mask.view(-1, *[1] * (like.dim() - 1))


def _fooling_or_start(model: Model, x_k: torch.Tensor, start: torch.Tensor,
                      y: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        fools = model(x_k).argmax(1) != y
    return torch.where(_rows(fools, x_k), x_k, start)


# ---------------------------------------------------------------- the evaluation's attacks


AttackFn = Callable[[Model, torch.Tensor, torch.Tensor, AdversarialSettings, torch.Generator],
                    torch.Tensor]


@dataclass(frozen=True)
class AttackImpl:
    name: str
    run: AttackFn
    """(model on pixels, x, labels, settings, generator) -> attacked x."""


ATTACK_IMPLS: Registry[AttackImpl] = Registry("attack")


def _apgd_ce_dlr(model: Model, x: torch.Tensor, y: torch.Tensor,
                 settings: AdversarialSettings, gen: torch.Generator) -> torch.Tensor:
    """APGD-CE, then APGD-DLR on the inputs CE did not fool (as AutoAttack runs them in
    turn); DLR needs three classes, so a two-class model gets CE alone."""
    steps, eps = settings.attack_steps(), settings.attack_epsilon()
    x_adv, fooled = apgd(model, x, y, eps=eps, steps=steps, loss="ce", generator=gen)
    rest = (~fooled).nonzero()[:, 0]
    if len(rest) == 0 or _classes(model, x) < 3:
        return x_adv
    x_dlr, fooled_dlr = apgd(model, x[rest], y[rest], eps=eps, steps=steps, loss="dlr",
                             generator=gen)
    x_adv[rest[fooled_dlr]] = x_dlr[fooled_dlr]
    return x_adv


def _classes(model: Model, x: torch.Tensor) -> int:
    with torch.no_grad():
        return int(model(x[:1]).shape[1])


def _autoattack_paper(model: Model, x: torch.Tensor, y: torch.Tensor,
                      settings: AdversarialSettings, gen: torch.Generator) -> torch.Tensor:
    """ART's AutoAttack([APGD-CE, APGD-DLR]) as the paper's evaluation calls it: the inputs
    the model gets right are attacked by CE, those it still gets right by DLR; an input keeps
    its clean pixels unless an attack fooled the model on it (misclassified ones are never
    attacked). DLR needs three classes (ART fails on two), so a two-class model gets CE."""
    eps, step, steps = settings.attack_epsilon(), settings.attack_step_size(), \
        settings.attack_steps()
    assert step is not None
    with torch.no_grad():
        logits = model(x)
    robust, x_adv = logits.argmax(1) == y, x.detach().clone()
    for loss in ("ce", "dlr") if logits.shape[1] >= 3 else ("ce",):
        idx = robust.nonzero()[:, 0]
        if len(idx) == 0:
            break
        out, fooled = apgd_paper(model, x_adv[idx], y[idx], eps=eps, step=step, steps=steps,
                                 loss=loss, generator=gen)
        x_adv[idx[fooled]] = out[fooled]
        robust[idx[fooled]] = False
    return x_adv


def _pgd_k(model: Model, x: torch.Tensor, y: torch.Tensor, settings: AdversarialSettings,
           gen: torch.Generator) -> torch.Tensor:
    k = settings.model_copy(update={"steps": settings.attack_steps(),
                                    "epsilon": settings.attack_epsilon(),
                                    "step_size": settings.attack_step_size()})
    return pgd(lambda z: F.cross_entropy(model(z), y, reduction="sum"), x, k, gen)


ATTACK_IMPLS.register(AttackImpl("autoattack_paper", _autoattack_paper))
ATTACK_IMPLS.register(AttackImpl("apgd", _apgd_ce_dlr))
ATTACK_IMPLS.register(AttackImpl("pgd", _pgd_k))


def attack_passes(settings: AdversarialSettings) -> int:
    """Forward-backward passes of the evaluation attack per input, at most (the APGD attacks:
    each loss's steps and its start)."""
    steps = settings.attack_steps()
    return steps if settings.attack == "pgd" else 2 * (steps + 1)
