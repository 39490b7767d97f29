from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.client.fake_service import FakeService


@pytest.fixture
def fake() -> Iterator[FakeService]:
    """The scripted fake service, on a free local port. A test that met an answer the real
    service could not have given (not in its OpenAPI document) errors at teardown."""
    with FakeService() as service:
        yield service
    assert not service.violations, (
        "the fake service gave answers the real one could not have:\n  "
        + "\n  ".join(service.violations))


@pytest.fixture(autouse=True)
def _isolated_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No STITCHSIM_* variable or config file of the machine running the tests leaks in."""
    import os

    for name in list(os.environ):
        if name.startswith("STITCHSIM_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.chdir(tmp_path)
