"""The contract stands alone: the models import without httpx or the SDK, the enumerations
have one ordering each (their Literal's), built-in datasets come from one catalogue."""

from __future__ import annotations

import subprocess
import sys
from typing import get_args

import stitchsim
from stitchsim import codes, models
from stitchsim.datasets import BUILTIN


def test_the_models_import_without_httpx_or_the_sdk() -> None:
    code = (
        "import sys, stitchsim.models, stitchsim.codes, stitchsim.files.dataset, stitchsim.view\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('httpx', 'httpcore') or "
        "m.startswith(('stitchsim.sdk', 'stitchsim.errors', 'stitchsim.cli')))\n"
        "assert not bad, bad\n"
        "from stitchsim import Client, Report, WaitTimeout\n"  # lazily, on first use
        "assert 'httpx' in sys.modules and Client.__module__ == 'stitchsim.sdk.client'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_package_names_resolve_lazily() -> None:
    assert set(stitchsim.__all__) >= {"Client", "Job", "Report", "Spec", "JobFailed"}
    assert stitchsim.Job.__module__ == "stitchsim.sdk.job"
    assert "Client" in dir(stitchsim)
    try:
        stitchsim.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("an unknown name must raise AttributeError")


def test_one_ordering_per_enumeration() -> None:
    assert models.OBJECTIVES == get_args(models.Objective) == ("hlm", "slm", "dm", "fula")
    assert get_args(models.Protocol) == models.PROTOCOLS
    assert models.PROTOCOLS[:2] == ("standard", "invariance_aware")
    assert models.DIRECTIONS == ("front_to_back", "back_to_front")
    assert get_args(models.Control) == models.CONTROLS
    assert set(models.ACTIVE_STATES) | set(models.TERMINAL_STATES) == set(models.JOB_STATES)


def test_builtin_datasets_come_from_one_catalogue() -> None:
    assert tuple(BUILTIN) == models.BUILTIN_DATASETS and "digits_marker" in BUILTIN
    assert all(d.description and d.n_classes == 10 for d in BUILTIN.values())


def test_client_exceptions_follow_the_registry() -> None:
    from stitchsim.errors import Conflict, JobFailed, RateLimited
    from stitchsim.models import ErrorInfo

    busy = Conflict("m", status_code=409, code="in_use")
    assert busy.retryable is codes.CODES["in_use"].retry is True
    assert busy.is_user_error is False
    assert Conflict("m", status_code=409, code="idempotency_conflict").is_user_error is True
    assert RateLimited("m", status_code=429, code="from_a_proxy").retryable  # by status
    assert JobFailed("j", ErrorInfo(code="weights_mismatch", message="")).is_user_error
    assert not JobFailed("j", ErrorInfo(code="engine_error", message="")).is_user_error
    assert not JobFailed("j", ErrorInfo(code="never_heard_of", message="")).is_user_error
