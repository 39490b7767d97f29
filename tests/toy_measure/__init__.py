"""A measure from outside the project, as a plug-in would add one: exactly two entries, its
catalogue entry (what it is called, how it is drawn) and its engine entry (how it is
computed), under one name. Nothing else in the project learns of it; the spec accepts it, the
job computes it, and the report, the page and the table show it.

The toy: the correlation, over samples, of the two representations' norms (a sample that is
loud in one model is loud in the other), with its bootstrap over the job's resamples."""

from __future__ import annotations

import torch
from stitchsim import catalogue
from stitchsim.models import MeasureSettings
from stitchsim_worker.engine.measures.similarity import MeasureImpl, register_measure

NAME = "norm_correlation"
CATALOGUE_ENTRY = catalogue.MeasureEntry(
    NAME, "norm correlation (toy)", "the correlation over samples of the two representations' "
    "norms: a toy measure registered by a test package", style=catalogue.PlotStyle(
        catalogue.PURPLE, ":", "^"))


def _prepare(x: torch.Tensor, w: torch.Tensor, _settings: MeasureSettings
             ) -> tuple[torch.Tensor, torch.Tensor]:
    return x.norm(dim=1), w.double()


def _correlation(a: torch.Tensor, b: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Weighted Pearson correlation of a and b (n,) for each row of weights w (R, n)."""
    w = w / w.sum(-1, keepdim=True)
    da, db = a - (w * a).sum(-1, keepdim=True), b - (w * b).sum(-1, keepdim=True)
    cov = (w * da * db).sum(-1)
    return cov / ((w * da * da).sum(-1) * (w * db * db).sum(-1)).clamp_min(1e-300).sqrt()


def _compare(xs: list[tuple[torch.Tensor, torch.Tensor]],
             ys: list[tuple[torch.Tensor, torch.Tensor]], _settings: MeasureSettings
             ) -> tuple[float, torch.Tensor]:
    a = torch.cat([x for x, _ in xs])
    b = torch.cat([y for y, _ in ys])
    w = torch.cat([w for _, w in xs], dim=-1)
    value = _correlation(a, b, torch.ones(1, len(a), dtype=a.dtype, device=a.device))[0]
    return float(value), _correlation(a, b, w)


ENGINE_ENTRY = MeasureImpl(name=NAME, prepare=_prepare, compare=_compare)


def register() -> None:
    """What a plug-in does on import: its catalogue entry, then its engine entry."""
    catalogue.MEASURES.register(CATALOGUE_ENTRY)
    register_measure(ENGINE_ENTRY)
