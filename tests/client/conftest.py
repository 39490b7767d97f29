from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.client.fake_service import FakeService


@pytest.fixture
def fake() -> Iterator[FakeService]:
    """The scripted fake service, on a free local port."""
    with FakeService() as service:
        yield service


@pytest.fixture(autouse=True)
def _isolated_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No STITCHSIM_* variable or config file of the machine running the tests leaks in."""
    import os

    for name in list(os.environ):
        if name.startswith("STITCHSIM_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.chdir(tmp_path)
