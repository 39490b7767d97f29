"""Shared fixtures of the report tests: a sample report and a headless Chromium."""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path

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

from tests.report.chromium import Chromium, find_chromium  # noqa: E402


@pytest.fixture(scope="session")
def chromium() -> Iterator[Chromium]:
    binary = find_chromium()
    if binary is None:
        message = "no chromium binary (Debian: apt-get install -y chromium)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI installs it: a missing browser is a broken setup there
        pytest.skip(message)
    with Chromium(binary) as browser:
        yield browser
