"""The adversarial protocols: PGD inputs crafted against the stitched model in training batches,
from the training inputs (adversarial) or from the front model's IRIs of them (iri_adversarial,
the invariance-aware paper's IRI x adversarial arm: its PGD runs on the IRI batches)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from stitchsim_worker.engine.core.context import Cut, JobContext
from stitchsim_worker.engine.models.attacks import pgd
from stitchsim_worker.engine.models.cutting import BackPart
from stitchsim_worker.engine.protocols.entry import (
    ProtocolImpl,
    register_protocol,
    stitched,
)
from stitchsim_worker.engine.protocols.invariance_aware import invariance_aware_split, iri_stage
from stitchsim_worker.engine.protocols.standard import standard_split
from stitchsim_worker.engine.stitching.layer import StitchLayer
from stitchsim_worker.engine.stitching.train import Augment, Batch


def _adversarial_augment(ctx: JobContext, cut: Cut, points: list[str], alpha: float) -> Augment:
    """A fraction alpha of each batch becomes PGD inputs crafted against the stitched model
    from the batch's own pixels (real inputs or IRIs), with the front part's view and the
    back model's targets recomputed on them."""
    settings = ctx.spec.adversarial
    front, probe = cut.f.front(cut.i), cut.g.probe(points)
    gen = torch.Generator().manual_seed(settings.seed)

    def augment(stitch: StitchLayer, back: BackPart, b: Batch) -> Batch:
        k = round(alpha * len(b.labels))
        if k == 0:
            return b
        assert b.pixels is not None
        sel = torch.randperm(len(b.labels), generator=gen)[:k].to(b.labels.device)
        h, labels = stitched(cut, stitch, back), b.labels[sel]
        x_adv = pgd(lambda x: F.cross_entropy(h(x), labels, reduction="sum"), b.pixels[sel],
                    settings, gen)
        with torch.no_grad():
            a_adv = front(x_adv)
            g_logits, *g_feats = probe(x_adv)
        ctx.tracker.step(settings.steps, "augment")

        def swap(t: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
            t = t.clone()
            t[sel] = new.to(t.dtype)
            return t

        return Batch(
            inputs=swap(b.inputs, a_adv), pixels=swap(b.pixels, x_adv),
            back_logits=swap(b.back_logits, g_logits), labels=b.labels,
            back_feats=[swap(t, f) for t, f in zip(b.back_feats, g_feats, strict=False)],
        )

    return augment


register_protocol(ProtocolImpl(
    name="adversarial", train_split=standard_split, augment=_adversarial_augment,
))
register_protocol(ProtocolImpl(
    name="iri_adversarial", train_split=invariance_aware_split, split_stage=iri_stage,
    augment=_adversarial_augment,
))
