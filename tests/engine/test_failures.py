"""No traceback reaches a user (issue 12): an unexpected failure inside the engine becomes an
error that names the stage, the stitch point and the objective; the traceback goes to the
log. The fault is injected through the objective registry, the engine's extension point."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
from stitchsim_worker.engine import EngineFailure
from stitchsim_worker.engine.objectives import OBJECTIVES
from stitchsim_worker.engine.train import FitTask

from tests.engine.jobs import layers, run, spec

QUICK = {"epochs": 1, "max_train_samples": 100, "max_test_samples": 50}


def _broken(task: FitTask) -> float:
    raise RuntimeError("shapes (4, 7) and (9, 2) cannot be multiplied\nsecond line")


def test_an_engine_failure_names_where_it_happened(
    ckpts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(OBJECTIVES, "fula", dataclasses.replace(OBJECTIVES["fula"], fit=_broken))
    s = spec(ckpts.digits_resnet, ckpts.digits_resnet_b, objectives=["dm", "fula"],
             protocols=["standard"], layers=layers("layer2"), train=QUICK)
    with caplog.at_level(logging.ERROR), pytest.raises(EngineFailure) as failure:
        run(s, tmp_path)
    message = failure.value.message
    assert message.startswith("the engine failed during train front_to_back layer2->layer2 ")
    assert "objective fula" in message and "protocol standard" in message
    assert "RuntimeError: shapes (4, 7) and (9, 2) cannot be multiplied" in message
    assert "second line" not in message and "Traceback" not in message
    assert failure.value.code == "engine_error"
    assert failure.value.details["objective"] == "fula"
    assert "Traceback" in caplog.text and "_broken" in caplog.text  # for the operator
