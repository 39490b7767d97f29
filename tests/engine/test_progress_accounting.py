"""The progress plan counts exactly the work a job reports: the ETA is the rate so far times
the units left, so a unit planned and never reported (or reported and never planned) is an
ETA that misses the job's end by that much. With IRIs of a fixed length (no early stop, no
extra rounds) and no cache hits, the first plan a job shows must equal what it did, for every
piece of work a spec can ask for: objectives, seeds, directions, protocols, controls,
measures, adversarial evaluation, cross-task data. The plan is the job's own list of steps
(job/plan.py), so each step is also held to its own count: a wrong one is named."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from stitchsim.models import Spec
from stitchsim_worker.engine import Resources, check_spec, run_job

# Small, and every batch size different from the split sizes, so runt batches count too.
BASE: dict[str, Any] = {
    "dataset": "digits",
    "layers": [{"front": "layer1", "back": "layer1"}],
    "objectives": ["slm"],
    "protocols": ["standard"],
    "directions": "front_to_back",
    "train": {"epochs": 1, "max_train_samples": 100, "max_test_samples": 300, "seed": 3,
              "batch_size": 32},
    "iri": {"steps": 3, "extra_rounds": 0, "stop_below": None},
}

CASES: dict[str, dict[str, Any]] = {
    "objectives_and_seeds": {"objectives": ["hlm", "slm", "dm", "fula"],
                             "train": {**BASE["train"], "seeds": 2}},
    "both_directions": {"directions": "both",
                        "layers": [{"front": "layer1", "back": "layer2"},
                                   {"front": "layer3", "back": "layer3"}]},
    "invariance_aware_with_controls": {
        "protocols": ["standard", "invariance_aware"],
        "controls": ["clustered_noise", "identity", "shortcut"],
        "control_settings": {"cues": ["pixel_specific", "rand_rand"]}},
    "adversarial": {"protocols": ["standard", "adversarial"], "objectives": ["slm", "dm"],
                    "adversarial": {"evaluate": True, "steps": 2, "eval_steps": 2}},
    # Two alphas (0: the clean arm, no augment) and the IRI x adversarial arm, under PGD-k.
    "adversarial_alphas_on_iris": {
        "protocols": ["iri_adversarial"], "objectives": ["slm"],
        "adversarial": {"evaluate": True, "steps": 2, "alphas": [0, 1], "attack": "pgd",
                        "eval_steps": 2}},
    "measures_both_directions": {"measures": ["cka", "mutual_knn"], "directions": "both",
                                 "protocols": ["standard", "invariance_aware"]},
    "measures_on_test_iris": {"measures": ["cka"], "measure_settings": {"iri_split": "test"}},
    "cross_task": {"protocols": ["cross_task", "standard"], "objectives": ["hlm"],
                   "front_dataset": "digits_colour_only"},
    # Another family in front, at a block inside its stack, stitched into the ResNet.
    "vit_block_into_resnet": {"layers": [{"front": "blocks.2", "back": "layer2"}],
                              "protocols": ["standard", "invariance_aware"],
                              "controls": ["identity"]},
}


def _run(spec: Spec, cache: Path, caplog: pytest.LogCaptureFixture
         ) -> list[tuple[str, int, int]]:
    calls: list[tuple[str, int, int]] = []
    with caplog.at_level(logging.WARNING, logger="stitchsim.engine"):
        run_job(spec, resources=Resources(cache_dir=cache),
                progress=lambda stage, done, total, _eta: calls.append((stage, done, total)))
    # Every step reported the units it counted, kind by kind (the runner logs the ones that
    # did not, by stage).
    assert [r.getMessage() for r in caplog.records if "counted wrong" in r.getMessage()] == []
    return calls


@pytest.mark.parametrize("case", list(CASES))
def test_the_first_plan_is_the_work_done(case: str, ckpts: Any, tmp_path: Path,
                                         caplog: pytest.LogCaptureFixture) -> None:
    front = {"cross_task": ckpts.colour_resnet,
             "vit_block_into_resnet": ckpts.digits_vit}.get(case, ckpts.digits_resnet)
    spec = Spec.model_validate({
        **BASE, **CASES[case],
        "front": {"checkpoint": {"path": str(front)}},
        "back": {"checkpoint": {"path": str(ckpts.digits_resnet_b)}},
    })
    calls = _run(spec, tmp_path / "cache", caplog)
    planned = next(total for _, _, total in calls if total)
    stage, done, total = calls[-1]
    assert stage == "done" and done == total
    # An IRI step counts the share of its batch still live, so each IRI set's units are a
    # fraction, rounded once in the plan.
    iri_sets = len({stage for stage, _, _ in calls if stage.startswith("iri ")})
    assert abs(done - planned) <= iri_sets, f"planned {planned} units, reported {done}"
    # The spec check prices the job with the same count (it knows no cross-task front data).
    if case != "cross_task":
        assert check_spec(spec, resources=Resources(cache_dir=tmp_path)).units == planned
