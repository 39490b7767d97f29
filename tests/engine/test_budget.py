"""The `ci` budget (issue 37): a spec naming it stitches at most 2 of the points `layers:
auto` picks (the first and the last), as it does of a listed `layers`."""

from __future__ import annotations

import torch
from stitchsim.models import Spec
from stitchsim_worker.engine.job.prepare import pair_points_of
from stitchsim_worker.engine.models.loading import random_model
from stitchsim_worker.engine.models.network import Network

REF = {"checkpoint": "sha256:" + "a" * 64}


def test_the_ci_budget_keeps_the_first_and_last_auto_point() -> None:
    model = random_model("test_resnet", {"num_classes": 10}, 32)
    net = Network(model, model.preprocess.input_size, torch.device("cpu"), "arch")
    full = pair_points_of(Spec.model_validate({"front": REF, "back": REF}), net, net)
    assert len(full) == 4  # layer1 .. layer4
    ci = pair_points_of(Spec.model_validate({"front": REF, "back": REF, "budget": "ci"}),
                        net, net)
    assert ci == [full[0], full[-1]]
