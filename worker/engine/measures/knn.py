"""Mutual k-nearest-neighbour alignment: the share of a sample's neighbours two
representations have in common."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from stitchsim.failure import Failure
from stitchsim.models import (
    MeasureSettings,
)
from stitchsim_worker.engine.measures.similarity import (
    MeasureImpl,
    register_measure,
)


@dataclass(frozen=True)
class Neighbours:
    idx: torch.Tensor  # (m, k) nearest neighbours of each sample in its batch
    w: torch.Tensor


def nearest(z: torch.Tensor, k: int) -> torch.Tensor:
    """Each row's k nearest rows by cosine similarity, itself excluded."""
    if len(z) <= k:
        raise Failure(
            "invalid_spec",
            f"mutual_knn needs more than knn_k={k} samples per mini-batch, but a batch holds "
            f"{len(z)}; lower measure_settings.knn_k or use more test samples",
        )
    zn = torch.nn.functional.normalize(z, dim=1)
    sim = zn @ zn.T
    sim.fill_diagonal_(-math.inf)
    return sim.topk(k, dim=1).indices


def knn_overlap(x: torch.Tensor, y: torch.Tensor, k: int) -> torch.Tensor:
    """Per sample: the share of its k nearest neighbours (cosine, itself excluded) that the
    two representations have in common (Huh et al. 2024, the platonic representation)."""
    return _overlap(nearest(x, k), nearest(y, k))


def _overlap(nx: torch.Tensor, ny: torch.Tensor) -> torch.Tensor:
    common = (nx[:, :, None] == ny[:, None, :]).any(-1).sum(-1)
    return common.double() / nx.shape[1]


def _knn_prepare(x: torch.Tensor, w: torch.Tensor, settings: MeasureSettings) -> Neighbours:
    return Neighbours(nearest(x, settings.knn_k), w)


def _knn_compare(xs: list[Neighbours], ys: list[Neighbours], _settings: MeasureSettings
                 ) -> tuple[float, torch.Tensor]:
    # Neighbourhoods are fixed by the batches; the resampling is over per-sample scores.
    scores = [_overlap(a.idx, b.idx) for a, b in zip(xs, ys, strict=True)]
    n = sum(len(s) for s in scores)
    boot = sum(a.w.double() @ s for a, s in zip(xs, scores, strict=True)) / n
    return float(torch.cat(scores).mean()), boot


# Cosine neighbours within each mini-batch; 1 when the neighbourhoods match.
register_measure(MeasureImpl(name="mutual_knn", prepare=_knn_prepare, compare=_knn_compare))
