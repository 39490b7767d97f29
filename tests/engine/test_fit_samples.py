"""A stitch fitted from too few activation vectors per unknown is named in the report's
warnings with the training samples that would be enough (issue 37: the `ci` budget's 64
samples leave a ConvNeXt's 2x2 last stage 5 vectors per unknown, and its figure there low).

One random tiny ConvNeXt as front and back, standard protocol, one epoch: what is asserted is
the count, which depends on the shapes and the samples, not on the weights."""

from __future__ import annotations

from pathlib import Path

import timm
import torch
from stitchsim_worker.engine.models.loading import save_checkpoint
from stitchsim_worker.engine.stitching.layer import MIN_VECTORS_PER_UNKNOWN

from tests.engine.jobs import layers, run, spec

ARCH, KWARGS = "test_convnext", {"num_classes": 10}


def _job(ckpt: Path, cache: Path, point: str, n: int) -> list[str]:
    s = spec(ckpt, ckpt, dataset="digits", layers=layers(point), objectives=["slm"],
             protocols=["standard"],
             train={"epochs": 1, "max_train_samples": n, "max_test_samples": 32})
    return [w for w in run(s, cache).warnings if "activation vectors" in w]


def test_a_stitch_with_too_few_vectors_per_unknown_is_named_with_the_samples_it_needs(
        tmp_path: Path) -> None:
    torch.manual_seed(0)
    ckpt = tmp_path / "convnext.safetensors"
    save_checkpoint(timm.create_model(ARCH, pretrained=False, **KWARGS), ckpt, ARCH, KWARGS)
    # stages.2 at 32 px: 48 channels on a 2x2 grid, so 49 unknowns per output channel and 4
    # vectors a sample: 64 samples give 256 vectors (5.2 per unknown); 10 per unknown needs
    # ceil(10 * 49 / 4) = 123 samples.
    assert MIN_VECTORS_PER_UNKNOWN == 10
    (few,) = _job(ckpt, tmp_path / "cache", "stages.2", 64)
    assert "stages.2" in few and "49 unknowns per output channel from 256 activation " \
        "vectors (64 samples, 5.2 per unknown" in few
    assert "it needs 123 training samples (train.max_train_samples" in few
    assert _job(ckpt, tmp_path / "cache", "stages.2", 123) == []
    # stages.0: 24 channels on 8x8, 64 samples give 4,096 vectors for 25 unknowns.
    assert _job(ckpt, tmp_path / "cache", "stages.0", 64) == []


def test_the_ci_budget_fits_every_stitch_from_enough_vectors_and_says_so(
        tmp_path: Path) -> None:
    torch.manual_seed(0)
    ckpt = tmp_path / "convnext.safetensors"
    save_checkpoint(timm.create_model(ARCH, pretrained=False, **KWARGS), ckpt, ARCH, KWARGS)
    s = spec(ckpt, ckpt, dataset="digits", layers=layers("stages.2"), objectives=["slm"],
             protocols=["standard"], budget="ci",
             train={"epochs": 1, "max_test_samples": 32})
    report = run(s, tmp_path / "cache")
    assert not [w for w in report.warnings if "activation vectors" in w]
    assert report.spec.train.max_train_samples is None  # the report keeps the spec as sent
    assert report.dataset["n_train"] == 123
    assert ("budget ci: 123 training samples for the stitch and its IRIs, more than its 64 so "
            "that every stitch fits its unknowns from at least 10 activation vectors each, as "
            "far as the training split allows") in report.notes
