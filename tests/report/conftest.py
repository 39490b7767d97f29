"""Shared fixtures of the report tests: a headless Chromium and a tiny real job."""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _ensure_importable() -> None:
    # The packages are normally installed (pip install -e client -e .); this fallback lets the
    # report tests run straight from a checkout too.
    if importlib.util.find_spec("stitchsim") is None:
        sys.path.insert(0, str(ROOT / "client"))
    if importlib.util.find_spec("stitchsim_service") is None:
        package = types.ModuleType("stitchsim_service")
        package.__path__ = [str(ROOT / "service")]
        sys.modules["stitchsim_service"] = package


_ensure_importable()

from tests.environment import chromium_problem, missing  # noqa: E402
from tests.report.chromium import Chromium, find_chromium  # noqa: E402


@pytest.fixture(scope="session")
def chromium() -> Iterator[Chromium]:
    """A headless Chromium; missing, a failure under CI (.ci/run installs it), else a skip."""
    binary = find_chromium()
    problem = chromium_problem(binary)
    if problem is not None:
        missing("Chromium", problem)
    assert binary is not None
    with Chromium(binary) as browser:
        yield browser


@pytest.fixture(scope="session")
def real_job(live_service: Any, ckpts: Any) -> tuple[str, dict[str, Any]]:
    """(job id, JSON report) of one tiny real job on the live service, shared by the tests
    that read its page."""
    from tests.report.realjob import run_tiny_job

    return run_tiny_job(live_service, ckpts)
