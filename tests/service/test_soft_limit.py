"""The soft time limit is known to have fired even when the code it interrupted swallowed it.

CI once saw a job past its limit end as `engine_error` ("NameError: module is not installed as
a submodule"): the limit's SoftTimeLimitExceeded came inside torch.fx tracing, which the model
splitter caught as "fx cannot trace this model", and the hook path then failed on the half-built
tracer. Two fixes, one test each: the worker remembers the signal (worker/soft_limit.py), and
the engine's broad excepts pass the interrupt on.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from billiard.pool import soft_timeout_sighandler
from celery.exceptions import SoftTimeLimitExceeded
from stitchsim_worker import soft_limit
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
