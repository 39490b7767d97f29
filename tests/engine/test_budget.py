"""The `ci` budget (issue 37): a spec naming it stitches at most 2 of the points `layers:
auto` picks (the first and the last; a listed `layers` is kept: test_gates), on 64
training samples, or on as many as its hungriest stitch point needs for 10 activation vectors
per unknown (stitching.layer.samples_needed), resolved at the job's points for the check's
price and the run alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import timm
import torch
from stitchsim.models import Spec
from stitchsim_worker.engine import Resources, check_spec
from stitchsim_worker.engine.job.check import with_budget_samples
from stitchsim_worker.engine.job.prepare import pair_points_of
from stitchsim_worker.engine.models.loading import random_model, save_checkpoint
from stitchsim_worker.engine.models.network import Network

REF = {"checkpoint": "sha256:" + "a" * 64}
CONVNEXT, KWARGS = "test_convnext", {"num_classes": 10}


def test_the_ci_budget_keeps_the_first_and_last_auto_point() -> None:
    model = random_model("test_resnet", {"num_classes": 10}, 32)
    net = Network(model, model.preprocess.input_size, torch.device("cpu"), "arch")
    full = pair_points_of(Spec.model_validate({"front": REF, "back": REF}), net, net)
    assert len(full) == 4  # layer1 .. layer4
    ci = pair_points_of(Spec.model_validate({"front": REF, "back": REF, "budget": "ci"}),
                        net, net)
    assert ci == [full[0], full[-1]]


def _spec(ckpt: Path, points: list[str], **fields: Any) -> Spec:
    ref = {"checkpoint": {"path": str(ckpt)}}
    return Spec.model_validate({"front": ref, "back": ref, "dataset": "digits",
                                "layers": [{"front": p, "back": p} for p in points],
                                "directions": "front_to_back", **fields})


def test_ci_takes_64_samples_or_what_its_hungriest_stitch_needs(tmp_path: Path) -> None:
    ckpt = tmp_path / "convnext.safetensors"
    save_checkpoint(timm.create_model(CONVNEXT, pretrained=False, **KWARGS), ckpt, CONVNEXT,
                    KWARGS)
    res = Resources(cache_dir=tmp_path / "cache")

    def samples(points: list[str], **fields: Any) -> int | None:
        return with_budget_samples(_spec(ckpt, points, **fields), res).train.max_train_samples

    # stages.0: 24 channels on 8x8 (25 unknowns, 64 vectors a sample): the floor is enough.
    assert samples(["stages.0"], budget="ci") == 64
    # stages.2: 48 channels on 2x2: ceil(10 * 49 / 4) = 123, for the whole job.
    assert samples(["stages.0", "stages.2"], budget="ci") == 123
    # Both directions: the same shapes each way here, so the same count.
    assert samples(["stages.2"], budget="ci", directions="both") == 123
    # The spec's own count wins; the full budget takes the spec's (None: every sample).
    assert samples(["stages.2"], budget="ci", train={"max_train_samples": 80}) == 80
    assert samples(["stages.2"]) is None
    # The check prices what runs: ci at stages.2 as the same spec asking for 123 itself.
    ci = check_spec(_spec(ckpt, ["stages.2"], budget="ci"), resources=res)
    own = check_spec(_spec(ckpt, ["stages.2"], budget="ci", train={"max_train_samples": 123}),
                     resources=res)
    floor = check_spec(_spec(ckpt, ["stages.2"], budget="ci", train={"max_train_samples": 64}),
                       resources=res)
    assert ci.units == own.units > floor.units


def test_ci_takes_at_most_the_training_split_and_names_what_ran(tmp_path: Path) -> None:
    # A torchvision resnet18 on 32 px digits: layer4 is 512 channels on 1x1, so 10 vectors
    # per unknown would need 5,130 samples; the split has fewer, and the spec says so.
    import torchvision
    from stitchsim_worker.engine.data.datasets import load_dataset

    ckpt = tmp_path / "resnet18.safetensors"
    save_checkpoint(torchvision.models.resnet18(weights=None, num_classes=10), ckpt,
                    "torchvision:resnet18", {"num_classes": 10})
    res = Resources(cache_dir=tmp_path / "cache")
    spec = _spec(ckpt, ["layer1", "layer4"], budget="ci")
    split = len(load_dataset("digits", res, spec.train).train)
    assert 64 < split < 5130
    assert with_budget_samples(spec, res).train.max_train_samples == split
