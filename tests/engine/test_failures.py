"""No traceback reaches a user (issue 12): an unexpected failure inside the engine becomes an
error that names the stage, the stitch point and the objective; the traceback goes to the
log. The fault is injected through the objective registry, the engine's extension point."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
from stitchsim.failure import Failure
from stitchsim.models import TrainSettings
from stitchsim_worker.engine.core.progress import Work
from stitchsim_worker.engine.stitching.objectives import OBJECTIVE_IMPLS, FitFn
from stitchsim_worker.engine.stitching.train import FitTask

from tests.engine.jobs import layers, run, spec

QUICK = {"epochs": 1, "max_train_samples": 100, "max_test_samples": 50}
FULA_FIT = OBJECTIVE_IMPLS["fula"].fit


def _broken(task: FitTask) -> float:
    raise RuntimeError("shapes (4, 7) and (9, 2) cannot be multiplied\nsecond line")


def _broken_fit(n: int, settings: TrainSettings) -> Work[FitFn]:
    """fula's fit with its own count, failing when it runs."""
    return Work(FULA_FIT(n, settings).units, _broken)


def test_an_engine_failure_names_where_it_happened(
    ckpts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(OBJECTIVE_IMPLS, "fula",
                        dataclasses.replace(OBJECTIVE_IMPLS["fula"], fit=_broken_fit))
    s = spec(ckpts.digits_resnet, ckpts.digits_resnet_b, objectives=["dm", "fula"],
             protocols=["standard"], layers=layers("layer2"), train=QUICK)
    with caplog.at_level(logging.ERROR), pytest.raises(Failure) as failure:
        run(s, tmp_path)
    message = failure.value.message
    assert message.startswith("the engine failed during train front_to_back layer2->layer2 ")
    assert "objective fula" in message and "protocol standard" in message
    assert "RuntimeError: shapes (4, 7) and (9, 2) cannot be multiplied" in message
    assert "second line" not in message and "Traceback" not in message
    assert failure.value.code == "engine_error"
    assert failure.value.details["objective"] == "fula"
    assert "Traceback" in caplog.text and "_broken" in caplog.text  # for the operator


def test_run_prints_the_message_keeps_the_traceback_in_a_file_and_exits_1(
    ckpts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse
    import json

    from stitchsim_worker.run_command import EXIT_FAILED, run_command

    monkeypatch.setitem(OBJECTIVE_IMPLS, "fula",
                        dataclasses.replace(OBJECTIVE_IMPLS["fula"], fit=_broken_fit))
    s = spec(ckpts.digits_resnet, ckpts.digits_resnet_b, objectives=["fula"],
             protocols=["standard"], layers=layers("layer2"), train=QUICK)
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(s.model_dump(mode="json", exclude_none=True)))
    args = argparse.Namespace(spec=spec_file, out=None, quiet=True, cache_dir=tmp_path / "c")
    # What `stitchsim-server`'s logging setup gives `run`: a handler writing to stderr. It sits
    # on the engine's logger, which does not propagate meanwhile: the client CLI's tests leave
    # handlers on the "stitchsim" logger above it, bound to streams that are closed by now.
    handler, engine_log = logging.StreamHandler(), logging.getLogger("stitchsim.engine")
    engine_log.addHandler(handler)
    monkeypatch.setattr(engine_log, "propagate", False)
    try:
        assert run_command(args) == EXIT_FAILED
    finally:
        engine_log.removeHandler(handler)
    err = capsys.readouterr().err
    assert "error: the engine failed during train front_to_back layer2->layer2" in err
    assert "Traceback" not in err and "traceback in" in err
    assert "_broken" in (tmp_path / "c" / "failures.log").read_text()
