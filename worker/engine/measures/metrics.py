"""Metric definitions (docs/method.md): the one place they are written down.

All figures are computed on the test split from logits; uncertainty is a percentile bootstrap
over test samples (or, with several seeds, a t-interval over seeds).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from stitchsim_worker.engine.core.registry import Registry

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


def soft_kappa(agree: torch.Tensor, h_true: torch.Tensor, g_true: torch.Tensor,
               n_classes: int) -> torch.Tensor:
    """Soft error consistency (the invariance-aware paper's soft kappa): kappa of the soft
    agreement against what two independent models with these soft accuracies would reach.

    c_obs is the mean soft agreement (`agreement_per_sample`); a and b are the mean softmax
    probabilities of the true class; c_exp = a b + (1 - a)(1 - b) / (K - 1), the chance that
    both put their mass on the same class when each spreads its error evenly over the K - 1
    wrong ones. Works on batched rows (the last dim is the samples)."""
    observed = agree.mean(-1)
    a, b = h_true.mean(-1), g_true.mean(-1)
    expected = a * b + (1 - a) * (1 - b) / max(n_classes - 1, 1)
    kappa = (observed - expected) / (1 - expected)
    return torch.where(expected >= 1 - 1e-12, torch.ones_like(kappa), kappa)


@dataclass(frozen=True)
class Outcomes:
    """Per-sample outcomes of a model h (the stitched one, or the front-position model with no
    stitch) against the model it ends in, g; index rows select resamples (the bootstrap)."""

    agree: torch.Tensor  # soft agreement
    same: torch.Tensor  # h and g predict the same class
    h_right: torch.Tensor
    g_right: torch.Tensor
    h_true: torch.Tensor  # h's softmax probability of the true class
    g_true: torch.Tensor
    n_classes: int

    @staticmethod
    def of(h_logits: torch.Tensor, g_logits: torch.Tensor, labels: torch.Tensor) -> Outcomes:
        h_pred, g_pred = h_logits.argmax(-1), g_logits.argmax(-1)
        column = labels.clamp_min(0)[:, None]  # unlabelled data never reaches here (logits)
        return Outcomes(
            agree=agreement_per_sample(h_logits, g_logits), same=h_pred == g_pred,
            h_right=h_pred == labels, g_right=g_pred == labels,
            h_true=h_logits.float().softmax(-1).gather(-1, column)[:, 0],
            g_true=g_logits.float().softmax(-1).gather(-1, column)[:, 0],
            n_classes=int(g_logits.shape[-1]),
        )

    def take(self, idx: torch.Tensor) -> Outcomes:
        return Outcomes(self.agree[idx], self.same[idx], self.h_right[idx], self.g_right[idx],
                        self.h_true[idx], self.g_true[idx], self.n_classes)


@dataclass(frozen=True)
class FigureEntry:
    """One figure of a result row: its statistic over the samples (the last dim)."""

    name: str
    statistic: Callable[[Outcomes], torch.Tensor]


FIGURES: Registry[FigureEntry] = Registry("row figure")
"""Every figure of a result row scored from class outputs, under its catalogue name
(stitchsim.catalogue.ROW_FIGURES, the entries with `classes`), in catalogue order; a row
carries each in its `figures`, with its interval. A new figure is its catalogue entry and its
entry here (tests/toy_figure)."""
register_figure = FIGURES.register

register_figure(FigureEntry("agreement", lambda o: o.agree.mean(-1)))
register_figure(FigureEntry("hard_agreement", lambda o: o.same.float().mean(-1)))
# The paper's `hard_agreement`: both right or both wrong (with different classes, too).
register_figure(FigureEntry("correct_agreement",
                            lambda o: (o.h_right == o.g_right).float().mean(-1)))
register_figure(FigureEntry("accuracy", lambda o: o.h_right.float().mean(-1)))
register_figure(FigureEntry("error_consistency", lambda o: cohens_kappa(o.h_right, o.g_right)))
register_figure(FigureEntry(
    "soft_kappa", lambda o: soft_kappa(o.agree, o.h_true, o.g_true, o.n_classes)))


class Figures(dict[str, float]):
    """A row's point figures by name (FIGURES); also readable as attributes."""

    def __getattr__(self, name: str) -> float:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    @staticmethod
    def names() -> tuple[str, ...]:
        return tuple(FIGURES)


def _figures(o: Outcomes) -> torch.Tensor:
    """One column per figure (FIGURES order); one row per resample when indexed in 2-D."""
    return torch.stack([entry.statistic(o) for entry in FIGURES.values()], dim=-1)


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
    outcomes = Outcomes.of(h_logits, g_logits, labels)
    point = _figures(outcomes)
    boot = bootstrap(lambda idx: _figures(outcomes.take(idx)), len(labels), seed)
    names = Figures.names()
    return Evaluation(
        figures=Figures({name: float(point[k]) for k, name in enumerate(names)}),
        ci={name: (float(boot[0, k]), float(boot[1, k])) for k, name in enumerate(names)},
        back_accuracy=float(outcomes.g_right.float().mean()),
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
