"""The contract stands alone: the models import without httpx or the SDK, the enumerations
have one ordering each (the catalogue's), built-in datasets come from one catalogue."""

from __future__ import annotations

import subprocess
import sys
from typing import get_args

import pytest
import stitchsim
from pydantic import ValidationError
from stitchsim import catalogue, codes, models
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
    assert catalogue.OBJECTIVES.names == ("hlm", "slm", "dm", "fula")
    assert catalogue.PROTOCOLS.names[:2] == ("standard", "invariance_aware")
    assert models.DIRECTIONS == get_args(models.Direction) == ("front_to_back", "back_to_front")
    assert set(models.ACTIVE_STATES) | set(models.TERMINAL_STATES) == set(models.JOB_STATES)


def test_the_spec_takes_the_catalogue_names_and_lists_them_in_its_schema() -> None:
    schema = models.Spec.model_json_schema()["properties"]
    for field, kind in (("objectives", catalogue.OBJECTIVES), ("protocols", catalogue.PROTOCOLS),
                        ("controls", catalogue.CONTROLS), ("measures", catalogue.MEASURES)):
        assert schema[field]["items"]["enum"] == list(kind.names)
        # The OpenAPI text is the catalogue's: every name with its description.
        assert all(f"{e.name}: {e.description}" in schema[field]["description"] for e in kind)
    base = {"front": {"checkpoint": "sha256:" + "a" * 64},
            "back": {"checkpoint": "sha256:" + "b" * 64}}
    assert models.Spec.model_validate(base).protocols == list(
        catalogue.PROTOCOLS.where(default=True))
    with pytest.raises(ValidationError) as refused:
        models.Spec.model_validate({**base, "protocols": ["standard", "telepathy"]})
    (error,) = refused.value.errors()
    assert error["loc"] == ("protocols", 1) and error["type"] == "literal_error"
    assert ("'standard', 'invariance_aware', 'adversarial', 'iri_adversarial' or 'cross_task'"
            in error["msg"])


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
