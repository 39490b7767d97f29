"""Step sizes by input resolution (issue 36): the fields a spec leaves unset take the paper's
32 px values on small inputs and its 224 px values (converted from ImageNet-normalised units
to pixels) from 85 px up; a value the spec sets wins; the report records what ran and the IRI
cache is keyed by it. Tiny jobs: an untrained test_resnet, IRIs at its stem, one step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import save_file
from stitchsim import catalogue
from stitchsim.models import IRISettings, Report, Spec
from stitchsim_worker.engine import Resources
from stitchsim_worker.engine.core.context import JobContext
from stitchsim_worker.engine.core.progress import Tracker
from stitchsim_worker.engine.iri.synthesis import cache_key
from stitchsim_worker.engine.job.prepare import prepare
from stitchsim_worker.engine.models.loading import save_checkpoint

from tests.engine.jobs import layers, run

CPU = torch.device("cpu")
HIGH_SIDE = catalogue.RESOLUTIONS["high"].min_side  # the smallest side the rule calls high
LOW, HIGH = catalogue.RESOLUTIONS["low"], catalogue.RESOLUTIONS["high"]
N_TRAIN, N_TEST = 12, 10


def _dataset(path: Path, side: int) -> Path:
    """Smooth RGB images of two classes, side x side, as an uploaded file."""
    g = torch.Generator().manual_seed(side)
    def images(n: int) -> torch.Tensor:
        x = torch.nn.functional.avg_pool2d(torch.rand(n, 3, side, side, generator=g), 5, 1, 2)
        return (x * 255).round().to(torch.uint8)
    save_file({"train_images": images(N_TRAIN), "train_labels": torch.arange(N_TRAIN) % 2,
               "test_images": images(N_TEST), "test_labels": torch.arange(N_TEST) % 2},
              str(path))
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("res") / "untrained.safetensors"
    save_checkpoint(timm.create_model("test_resnet", num_classes=2), path, "test_resnet",
                    {"num_classes": 2})
    return path


def _spec(model: Path, data: Path, iri: dict[str, Any] | None = None,
          adversarial: dict[str, Any] | None = None) -> Spec:
    ref = {"checkpoint": {"path": str(model)}, "preprocess": "none"}
    return Spec.model_validate({
        "front": ref, "back": ref, "dataset": {"path": str(data)},
        "directions": "front_to_back", "layers": layers("act1"), "objectives": ["dm"],
        "protocols": ["invariance_aware"],
        "train": {"epochs": 1, "max_train_samples": N_TRAIN, "max_test_samples": N_TEST},
        # One signed step from the noise, kept: x' - noise is the step itself.
        "iri": {"steps": 1, "extra_rounds": 0, **(iri or {})},
        "adversarial": {"evaluate": True, "eval_steps": 1, **(adversarial or {})},
    })


def _first_step(s: Spec, report: Report, cache: Path) -> float:
    """The size of the IRIs' one step, read off the IRIs the job cached under the key of the
    settings the report says ran: the median |x' - noise| over pixels the clamp left alone."""
    resources = Resources(cache_dir=cache)
    prep = prepare(s, resources, CPU)
    ctx = JobContext.new(s.at(prep.resolution), prep, resources, Tracker(None, None), CPU)
    try:
        key = cache_key(prep.ids["front"], "act1", prep.data.digest, report.iri_settings)
        cached = ctx.iri_cache.load(key)
    finally:
        ctx.close()
    assert cached is not None, "no IRIs under the key of the settings the report records"
    images = torch.from_numpy(np.array(cached[0], dtype=np.float32))
    noise = torch.rand(images.shape, generator=torch.Generator().manual_seed(s.iri.seed))
    moved = (images - noise).abs()
    inside = (images > 0) & (images < 1)
    return float(moved[inside].median())


@pytest.mark.parametrize(("side", "preset"), [(32, LOW), (HIGH_SIDE, HIGH)],
                         ids=["32px", f"{HIGH_SIDE}px"])
def test_unset_steps_take_the_input_resolutions_preset_and_the_report_says_so(
    model: Path, tmp_path: Path, side: int, preset: catalogue.ResolutionEntry
) -> None:
    s = _spec(model, _dataset(tmp_path / "data.safetensors", side))
    assert s.iri.step_size is None and s.adversarial.epsilon is None
    report = run(s, tmp_path)
    assert report.resolution == preset.name
    assert report.spec == s  # the spec as submitted; what ran is recorded beside it
    iri = report.iri_settings
    assert iri is not None and iri.step_size == preset.iri_step_size
    assert iri.described(report.resolution) == "paper (steps 1, extra_rounds 0)"
    adv = report.adversarial_settings
    assert adv is not None
    assert (adv.epsilon, adv.step_size) == (preset.epsilon, preset.step_size)
    assert (adv.eval_epsilon, adv.eval_step_size) == (None, None)  # they follow the above
    robust = report.results[0].robust
    assert robust is not None
    assert (robust.epsilon, robust.step_size) == (preset.epsilon, preset.step_size)
    assert report.method is not None
    assert report.method.settings["iri.step_size"] == preset.iri_step_size
    assert report.method.settings["adversarial.epsilon"] == preset.epsilon
    # The step the IRIs took, in [0,1] pixels: 1/255 at 32 px, the paper's 224 px step
    # (5 x 4.758/255 normalised = 5.38/255 in pixels) from 85 px.
    assert _first_step(s, report, tmp_path) == pytest.approx(preset.iri_step_size, rel=1e-3)


@pytest.mark.parametrize("side", [32, HIGH_SIDE], ids=["32px", f"{HIGH_SIDE}px"])
def test_a_step_the_spec_sets_wins_at_every_size(
    model: Path, tmp_path: Path, side: int
) -> None:
    s = _spec(model, _dataset(tmp_path / "data.safetensors", side), iri={"step_size": 3 / 255},
              adversarial={"epsilon": 6 / 255, "step_size": 1.5 / 255})
    report = run(s, tmp_path)
    assert report.iri_settings is not None and report.iri_settings.step_size == 3 / 255
    assert report.iri_settings.described(report.resolution) == (
        f"paper (steps 1, step_size {3 / 255:g}, extra_rounds 0)")
    robust = report.results[0].robust
    assert robust is not None and (robust.epsilon, robust.step_size) == (6 / 255, 1.5 / 255)
    assert _first_step(s, report, tmp_path) == pytest.approx(3 / 255, rel=1e-3)


def test_the_low_resolution_preset_is_the_values_every_job_ran_before() -> None:
    # The demo (32 px digits) must not move: the same values, so the same IRI cache keys and
    # method records as the releases before presets by resolution.
    assert (LOW.iri_step_size, LOW.epsilon, LOW.step_size) == (1 / 255, 8 / 255, 2 / 255)
    assert [catalogue.resolution_of(s) for s in (28, 32, 64, 84, 85, 96, 224)] == [
        "low", "low", "low", "low", "high", "high", "high"]
    # A default spec at 32 px keys its IRIs as a spec of before did (step_size 1/255 explicit):
    # the demo's cached IRIs and reference-cache entries stay valid.
    old = IRISettings.model_validate({"step_size": 1 / 255})
    assert cache_key({"m": 1}, "act1", "d", IRISettings().at("low")) == cache_key(
        {"m": 1}, "act1", "d", old)
    assert cache_key({"m": 1}, "act1", "d", IRISettings().at("high")) != cache_key(
        {"m": 1}, "act1", "d", old)
    # The paper's 224 px configs: 5, 4 and 1 x 4.758/255 in ImageNet-normalised units.
    mean_std = (0.229 + 0.224 + 0.225) / 3
    assert HIGH.iri_step_size / mean_std == pytest.approx(0.09329411764)
    assert HIGH.epsilon / mean_std == pytest.approx(0.07463529411)
    assert HIGH.step_size / mean_std == pytest.approx(0.01865882352)
