"""The soft time limit is known to have fired even when the code it interrupted swallowed it.

CI once saw a job past its limit end as `engine_error` ("NameError: module is not installed as
a submodule"): the limit's SoftTimeLimitExceeded came inside torch.fx tracing, which the model
splitter caught as "fx cannot trace this model", and the hook path then failed on the half-built
tracer. Two fixes: the worker remembers the signal (worker/soft_limit.py) and the runner reads
it when a job or a check fails, and the engine's broad excepts pass the interrupt on.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from billiard.pool import soft_timeout_sighandler
from celery.exceptions import SoftTimeLimitExceeded
from stitchsim.failure import Failure
from stitchsim_service.core import jobs
from stitchsim_service.core.context import Context
from stitchsim_service.core.settings import Settings
from stitchsim_worker import runner, soft_limit
from stitchsim_worker.engine.core import errors
from stitchsim_worker.engine.models.cutting import ModelSplitter
from torch import nn


@pytest.fixture
def pool_handler() -> object:
    """SIGUSR1 as a Celery pool process has it: raise SoftTimeLimitExceeded where it lands."""
    before = signal.signal(signal.SIGUSR1, soft_timeout_sighandler)
    yield soft_timeout_sighandler
    signal.signal(signal.SIGUSR1, before)


def _swallowing_code_that_fails_later() -> None:
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(5)  # the handler runs here and raises
    except Exception:  # noqa: BLE001, S110 - what a library may do with the interrupt
        pass
    raise NameError("module is not installed as a submodule")


def test_a_swallowed_soft_limit_is_still_known_to_have_fired(pool_handler: object) -> None:
    with soft_limit.watched() as fired, pytest.raises(NameError):
        _swallowing_code_that_fails_later()
    assert fired.is_set
    assert signal.getsignal(signal.SIGUSR1) is pool_handler  # the pool's handler is back


def test_the_pool_handler_still_raises_while_watched(pool_handler: object) -> None:
    with soft_limit.watched() as fired, pytest.raises(SoftTimeLimitExceeded):
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(5)
    assert fired.is_set


def test_nothing_fired_is_nothing_recorded(pool_handler: object) -> None:
    with soft_limit.watched() as fired, pytest.raises(NameError):
        raise NameError("a bug of ours")
    assert not fired.is_set


class _InterruptedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise SoftTimeLimitExceeded()


def test_a_time_limit_during_fx_tracing_is_not_taken_for_an_untraceable_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(errors, "INTERRUPTS", [*errors.INTERRUPTS, SoftTimeLimitExceeded])
    with pytest.raises(SoftTimeLimitExceeded):
        ModelSplitter(_InterruptedForward())


ENGINE_ERROR = Failure("engine_error", "the engine failed during prepare: NameError: module is "
                       "not installed as a submodule")


def _engine_that_swallows(fire: bool) -> Any:
    def outcome(*_: Any) -> jobs.Outcome:
        if fire:
            _swallowed_interrupt()
        return jobs.Outcome.failed(ENGINE_ERROR)
    return outcome


def _swallowed_interrupt() -> None:
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(5)
    except Exception:  # noqa: BLE001, S110 - what the fx tracer's caller did with it
        pass


@pytest.mark.parametrize("fired", [True, False])
def test_a_job_that_fails_after_its_soft_limit_fired_fails_as_time_limit(
    pool_handler: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fired: bool,
) -> None:
    ctx = Context.open(Settings(data_dir=tmp_path, job_time_limit_s=40))
    # The engine's outcome as CI saw it, the interrupt swallowed on the way (or not sent).
    monkeypatch.setattr(runner, "_engine_outcome", _engine_that_swallows(fired))
    outcome = runner._run_engine(ctx, None, None)  # type: ignore[arg-type]
    assert outcome.failure is not None
    if fired:
        assert outcome.failure.code == "time_limit"
        assert "past its time limit of 10 s" in outcome.failure.message
    else:
        assert outcome.failure.code == "engine_error"  # a bug of ours stays one


def test_a_spec_check_that_fails_after_its_soft_limit_fired_timed_out(
    pool_handler: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    ctx = Context.open(Settings(data_dir=tmp_path))

    def answer(*_: Any) -> dict[str, Any]:
        _swallowed_interrupt()
        return {"failure": Failure("invalid_input_size", "does not run on 32px inputs").as_dict()}

    monkeypatch.setattr(runner, "_check_spec_answer", answer)
    failure = runner.check_spec_doc(ctx, {})["failure"]
    assert failure["code"] == "spec_check_timeout"  # not blamed on the user's model
