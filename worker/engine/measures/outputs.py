"""The output kinds (issue 28), one registered entry each: how a back model's output is read.

A logits model is scored by its softmaxes and classes; an embedding model by the cosine of the
stitched and the back model's vectors and whether the stitched vector retrieves its own
input's back-model vector among the test split's; an image model (an autoencoder) by 1 - the
relative reconstruction error against the back model's own output, with the PSNR and the same
retrieval agreement beside it. Each entry also says what the stitch is trained towards when
the objective matches outputs (slm), and how a model of its kind is recognised. What a kind is
called and its flags are its catalogue entry's (stitchsim.catalogue.OUTPUT_KINDS).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from stitchsim import catalogue
from stitchsim.models import Figure, OutputKind
from stitchsim_worker.engine.core.registry import Registry
from stitchsim_worker.engine.measures.metrics import (
    Figures,
    bootstrap,
    evaluate,
    per_sample_distance,
    seed_interval,
)

RETRIEVAL_CHUNK = 512
"""Queries compared with the whole gallery at once: memory stays chunk x N."""
PSNR_CAP = 100.0
"""The PSNR of an exact copy (zero error) is infinite; reported as this many dB."""


@dataclass
class Scored:
    """One stitched model's figures against the back model on one test split."""

    values: dict[str, float]
    ci: dict[str, tuple[float, float]]
    back_accuracy: float | None = None

    def figures(self) -> dict[str, Figure]:
        """The row's figures, in catalogue order (stitchsim.catalogue.ROW_FIGURES)."""
        return {name: Figure(value=self.values[name], ci=self.ci.get(name))
                for name in catalogue.ROW_FIGURES.ordered(self.values)}

    @staticmethod
    def over_seeds(seeds: list[Scored]) -> Scored:
        """Several seeds' figures: each one's mean, with its t-interval over the seeds."""
        values, ci = {}, {}
        for name in seeds[0].values:
            values[name], ci[name] = seed_interval([s.values[name] for s in seeds])
        return Scored(values, ci)


@dataclass(frozen=True)
class OutputEntry:
    name: OutputKind
    score: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], Scored]
    """(stitched outputs, back outputs, labels, seed) -> figures, with bootstrap CIs."""
    match: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """The output-matching loss (stitched, back) the slm objective trains with."""
    detect: Callable[[tuple[int, ...], int], bool]
    """(per-sample output shape, the model's num_classes) -> whether it is of this kind; the
    first kind in catalogue order that says yes is the model's."""


OUTPUTS: Registry[OutputEntry] = Registry("output kind")
register_output = OUTPUTS.register


def detect_kind(shape: tuple[int, ...], num_classes: int) -> OutputKind:
    for entry in OUTPUTS.values():
        if entry.detect(shape, num_classes):
            return entry.name
    raise ValueError(f"no output kind reads a per-sample output of shape {shape}")


# ---------------------------------------------------------------- shared figures


def retrieval_hits(h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Per sample: whether the stitched output's nearest back-model output (cosine, over the
    whole test split) is its own input's. A stitch that ignores its input retrieves one
    sample for all (about 1/N); a perfect one retrieves each its own."""
    hn = F.normalize(h.flatten(1).float(), dim=1)
    gn = F.normalize(g.flatten(1).float(), dim=1)
    hits = []
    for s in range(0, len(hn), RETRIEVAL_CHUNK):
        sims = hn[s : s + RETRIEVAL_CHUNK] @ gn.T
        own = torch.arange(s, s + len(sims))
        # Ties (a constant output) resolve to the lowest index: no sample is retrieved by luck.
        hits.append(sims.argmax(1) == own)
    return torch.cat(hits)


def _score_samples(per_sample: dict[str, torch.Tensor], seed: int) -> Scored:
    """Means of per-sample figures, with percentile-bootstrap CIs over the test samples."""
    names = list(per_sample)
    stacked = torch.stack([per_sample[k].float() for k in names], dim=-1)  # N x F
    boot = bootstrap(lambda idx: stacked[idx].mean(-2), len(stacked), seed)
    return Scored(
        values={k: float(stacked[:, i].mean()) for i, k in enumerate(names)},
        ci={k: (float(boot[0, i]), float(boot[1, i])) for i, k in enumerate(names)},
    )


# ---------------------------------------------------------------- logits


def _score_logits(h: torch.Tensor, g: torch.Tensor, labels: torch.Tensor, seed: int) -> Scored:
    ev = evaluate(h, g, labels, seed=seed)
    return Scored({k: getattr(ev.figures, k) for k in Figures.names()}, dict(ev.ci),
                  ev.back_accuracy)


def _soft_label_loss(h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    # KL(softmax g || softmax h), temperature 1.
    return F.kl_div(h.log_softmax(-1), g.log_softmax(-1), log_target=True,
                    reduction="batchmean")


register_output(OutputEntry(
    name="logits", score=_score_logits, match=_soft_label_loss,
    detect=lambda shape, classes: len(shape) == 1 and classes > 0,
))


# ---------------------------------------------------------------- embedding


def _score_embedding(h: torch.Tensor, g: torch.Tensor, _labels: torch.Tensor, seed: int
                     ) -> Scored:
    cosine = F.cosine_similarity(h.flatten(1).float(), g.flatten(1).float(), dim=1)
    return _score_samples({"agreement": cosine, "hard_agreement": retrieval_hits(h, g)}, seed)


def _cosine_loss(h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return 1 - F.cosine_similarity(h.flatten(1), g.flatten(1), dim=1).mean()


register_output(OutputEntry(
    name="embedding", score=_score_embedding, match=_cosine_loss,
    detect=lambda shape, classes: len(shape) == 1,
))


# ---------------------------------------------------------------- image


def psnr_per_sample(h: torch.Tensor, g: torch.Tensor, peak: float) -> torch.Tensor:
    """10 log10(peak^2 / MSE) per sample, capped at PSNR_CAP for an exact copy."""
    mse = ((h.float() - g.float()) ** 2).flatten(1).mean(1)
    ratio = peak**2 / mse.clamp_min(peak**2 * 10 ** (-PSNR_CAP / 10))
    return 10 * torch.log10(ratio)


def _score_image(h: torch.Tensor, g: torch.Tensor, _labels: torch.Tensor, seed: int) -> Scored:
    # 1 - relative error per sample, floored at 0: a stitched output further from the back
    # model's than zero is would otherwise pull the mean below any meaning.
    fidelity = (1 - per_sample_distance(h.float(), g.float())).clamp_min(0)
    g32 = g.float()
    peak = float(g32.max() - g32.min()) or 1.0  # the back model's own output range
    return _score_samples({"agreement": fidelity, "hard_agreement": retrieval_hits(h, g),
                           "psnr": psnr_per_sample(h, g, peak)}, seed)


def _relative_squared_error(h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return ((h - g) ** 2).sum() / (g**2).sum().clamp_min(1e-12)


register_output(OutputEntry(
    name="image", score=_score_image, match=_relative_squared_error,
    detect=lambda shape, classes: len(shape) == 3 and min(shape[1:]) > 1,
))
