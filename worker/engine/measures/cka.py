"""Linear CKA, unbiased: mini-batch HSIC accumulated over a seeded partition."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from stitchsim.models import (
    MeasureSettings,
)
from stitchsim_worker.engine.measures.similarity import (
    MeasureImpl,
    register_measure,
)


def gram(x: torch.Tensor) -> torch.Tensor:
    """Linear kernel of the batch's rows, with a zero diagonal (the unbiased estimator's K~).
    Rows are centred first: the estimator is invariant to it, and it keeps off-diagonal
    entries small, so leaving out the pairs of a resampled sample with its own copies (see
    weighted_hsic1) biases the bootstrap little."""
    xc = x - x.mean(0, keepdim=True)
    k = xc @ xc.T
    return k.fill_diagonal_(0.0)


def hsic1(k: torch.Tensor, lk: torch.Tensor) -> torch.Tensor:
    """Unbiased HSIC (Song et al. 2012) of zero-diagonal kernels (..., n, n), batched:
    [tr(KL) + 1'K1 1'L1 / ((n-1)(n-2)) - 2/(n-2) 1'KL1] / (n(n-3))."""
    n = k.shape[-1]
    trace = (k * lk).sum((-2, -1))  # tr(KL) for symmetric K, L
    ks, ls = k.sum(-1), lk.sum(-1)
    total = ks.sum(-1) * ls.sum(-1) / ((n - 1) * (n - 2))
    return (trace + total - 2.0 * (ks * ls).sum(-1) / (n - 2)) / (n * (n - 3))


@dataclass(frozen=True)
class GramBatch:
    """One representation's kernel on one mini-batch, with what every bootstrap resample of
    it needs (K w and w'Kw per resample) and its own HSIC(K, K). The point estimate is in
    float64; the resamples only place an interval, so they run in float32 (half the time)."""

    k: torch.Tensor
    k32: torch.Tensor
    w: torch.Tensor  # float32 multiplicities (exact: small integers)
    kw: torch.Tensor
    wkw: torch.Tensor
    own: torch.Tensor | None = None  # hsic1(K, K)
    own_boot: torch.Tensor | None = None  # (R,)

    @classmethod
    def of(cls, k: torch.Tensor, w: torch.Tensor, own: bool = True) -> GramBatch:
        k32 = k.float()
        kw = w @ k32
        part = cls(k, k32, w, kw, (kw * w).sum(-1))
        if not own:
            return part
        return cls(k, k32, w, kw, part.wkw, hsic1(k, k), _resampled_hsic(part, part))


def _resampled_hsic(a: GramBatch, b: GramBatch) -> torch.Tensor:
    """hsic1 of the batch resampled with multiplicities w (R, n): a sample drawn twice is no
    pair of distinct samples, so its copies meet only through K's zero diagonal, and every
    term of the estimator is a quadratic or cubic form in w (no resampled matrix is built)."""
    n, w = a.k.shape[-1], a.w
    trace = (w @ (a.k32 * b.k32) * w).sum(-1)
    total = a.wkw * b.wkw / ((n - 1) * (n - 2))
    cross = (w * a.kw * b.kw).sum(-1)
    return ((trace + total - 2.0 * cross / (n - 2)) / (n * (n - 3))).double()


def weighted_hsic1(k: torch.Tensor, lk: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """hsic1 of K and L on the resamples w (what the bootstrap computes)."""
    w = w.float()
    return _resampled_hsic(GramBatch.of(k, w, own=False), GramBatch.of(lk, w, own=False))


def cka_from_sums(xy: torch.Tensor, xx: torch.Tensor, yy: torch.Tensor) -> torch.Tensor:
    """Mini-batch CKA (Nguyen et al. 2021): sum of HSIC(X,Y) over batches over the geometric
    mean of the sums of HSIC(X,X) and HSIC(Y,Y)."""
    return xy / (xx * yy).clamp_min(1e-300).sqrt()


def _cka_prepare(x: torch.Tensor, w: torch.Tensor, _settings: MeasureSettings) -> GramBatch:
    return GramBatch.of(gram(x), w)


def _cka_compare(xs: list[GramBatch], ys: list[GramBatch], _settings: MeasureSettings
                 ) -> tuple[float, torch.Tensor]:
    xy = sum(hsic1(a.k, b.k) for a, b in zip(xs, ys, strict=True))
    xx, yy = sum(a.own for a in xs), sum(b.own for b in ys)  # type: ignore[misc]
    # Resampled within each batch: the estimator is built batch by batch.
    boot_xy = sum(_resampled_hsic(a, b) for a, b in zip(xs, ys, strict=True))
    boot_xx = sum(a.own_boot for a in xs)  # type: ignore[misc]
    boot_yy = sum(b.own_boot for b in ys)  # type: ignore[misc]
    return float(cka_from_sums(xy, xx, yy)), cka_from_sums(boot_xy, boot_xx, boot_yy)


# As in the invariance-aware paper's code; 1 for representations equal up to rotation and scale.
register_measure(MeasureImpl(name="cka", prepare=_cka_prepare, compare=_cka_compare))
