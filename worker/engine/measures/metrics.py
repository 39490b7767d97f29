"""Metric definitions (DESIGN §1): the one place they are written down.

All figures are computed on the test split from logits; uncertainty is a percentile bootstrap
over test samples (or, with several seeds, a t-interval over seeds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

BOOTSTRAP_RESAMPLES = 1000
_BOOT_CHUNK = 100
# Two-sided 95% Student t quantiles for 1..30 degrees of freedom.
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042]  # fmt: skip


def agreement_per_sample(h_logits: torch.Tensor, g_logits: torch.Tensor) -> torch.Tensor:
    """<p_h, p_g> / max(|p_h|^2, |p_g|^2) with p = softmax: 1 iff the distributions match."""
    p_h, p_g = h_logits.float().softmax(-1), g_logits.float().softmax(-1)
    dot = (p_h * p_g).sum(-1)
    return dot / torch.maximum((p_h * p_h).sum(-1), (p_g * p_g).sum(-1))


def relative_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """d(a, b) = |a - b|_F / |b|_F over the whole batch tensor."""
    return torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-12)


def per_sample_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # Norms over the sample's own dims, not over a flattened copy: flattening a channels-last
    # map copies it, and its gradient comes back in NCHW, which makes the first backward op of
    # a channels-last front mix layouts (test_resnet's act1: a third slower a step).
    if a.dim() == 1:  # one number a sample
        a, b = a[:, None], b[:, None]
    dims = tuple(range(1, a.dim()))
    diff = torch.linalg.vector_norm(a - b, dim=dims)
    return diff / torch.linalg.vector_norm(b, dim=dims).clamp_min(1e-12)


def pixel_rms(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per sample: the root mean square of a - b over its pixels and channels, in the images'
    own units ([0,1] pixels: 1/255 is one grey level)."""
    return (a.float() - b.float()).square().flatten(1).mean(1).sqrt()


def cohens_kappa(h_right: torch.Tensor, g_right: torch.Tensor) -> torch.Tensor:
    """Error consistency: kappa of 'h is right' vs 'g is right' (works on batched rows)."""
    h, g = h_right.float(), g_right.float()
    observed = (h == g).float().mean(-1)
    ph, pg = h.mean(-1), g.mean(-1)
    expected = ph * pg + (1 - ph) * (1 - pg)
    kappa = (observed - expected) / (1 - expected)
    # Both always right (or both always wrong in lockstep): perfect consistency.
    return torch.where(expected >= 1 - 1e-12, torch.ones_like(kappa), kappa)


@dataclass
class Figures:
    agreement: float
    hard_agreement: float
    accuracy: float
    error_consistency: float

    @staticmethod
    def names() -> tuple[str, ...]:
        return ("agreement", "hard_agreement", "accuracy", "error_consistency")


def _figures(
    agree: torch.Tensor, same: torch.Tensor, h_right: torch.Tensor, g_right: torch.Tensor
) -> torch.Tensor:
    """Rows of (agreement, hard_agreement, accuracy, error_consistency) per resample."""
    return torch.stack(
        [
            agree.mean(-1),
            same.float().mean(-1),
            h_right.float().mean(-1),
            cohens_kappa(h_right, g_right),
        ],
        dim=-1,
    )


@dataclass
class Evaluation:
    figures: Figures
    ci: dict[str, tuple[float, float]]
    back_accuracy: float

    @property
    def stitching_penalty(self) -> float:
        return self.back_accuracy - self.figures.accuracy


def evaluate(
    h_logits: torch.Tensor, g_logits: torch.Tensor, labels: torch.Tensor, seed: int = 0
) -> Evaluation:
    agree = agreement_per_sample(h_logits, g_logits)
    h_pred, g_pred = h_logits.argmax(-1), g_logits.argmax(-1)
    same, h_right, g_right = h_pred == g_pred, h_pred == labels, g_pred == labels
    point = _figures(agree, same, h_right, g_right)
    boot = bootstrap(
        lambda idx: _figures(agree[idx], same[idx], h_right[idx], g_right[idx]), len(labels), seed
    )
    names = Figures.names()
    return Evaluation(
        figures=Figures(*[float(v) for v in point]),
        ci={name: (float(boot[0, k]), float(boot[1, k])) for k, name in enumerate(names)},
        back_accuracy=float(g_right.float().mean()),
    )


def bootstrap(statistic, n: int, seed: int) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """2.5% and 97.5% percentiles of `statistic(index_rows)` over resamples of n items."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for start in range(0, BOOTSTRAP_RESAMPLES, _BOOT_CHUNK):
        k = min(_BOOT_CHUNK, BOOTSTRAP_RESAMPLES - start)
        rows.append(statistic(torch.randint(0, n, (k, n), generator=g)))
    stats = torch.cat(rows).double()
    return torch.quantile(stats, torch.tensor([0.025, 0.975], dtype=torch.float64), dim=0)


def accuracy_with_ci(
    logits: torch.Tensor, labels: torch.Tensor, seed: int = 0
) -> tuple[float, tuple[float, float]]:
    right = (logits.argmax(-1) == labels).float()
    ci = bootstrap(lambda idx: right[idx].mean(-1, keepdim=True), len(labels), seed)
    return float(right.mean()), (float(ci[0, 0]), float(ci[1, 0]))


def seed_interval(values: list[float]) -> tuple[float, tuple[float, float]]:
    """Mean and 95% t-interval over independent seeds."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, (mean, mean)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = _T95[min(n - 1, len(_T95)) - 1] * sd / math.sqrt(n)
    return mean, (mean - half, mean + half)


def near_chance(accuracy: float, ci: tuple[float, float], chance: float) -> bool:
    """Indistinguishable from guessing: the interval reaches chance, or the accuracy covers
    less than a tenth of the way from chance to perfect."""
    return ci[0] <= chance or accuracy < chance + 0.1 * (1 - chance)
