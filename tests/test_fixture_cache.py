"""The trained-model cache of tests/fixtures_models.py: one build for concurrent callers, a
new entry for new settings or code, and a half-written entry never read."""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.fixtures_models import cache_key, cached_model


def test_concurrent_callers_build_once_and_read_the_same_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STITCHSIM_TEST_CACHE", str(tmp_path / "cache"))
    builds: list[Path] = []

    def build(path: Path) -> dict[str, float]:
        builds.append(path)
        time.sleep(0.3)  # long enough for the other callers to be waiting on the lock
        path.write_bytes(b"weights")
        return {"test_accuracy": 0.5}

    def call(k: int) -> dict[str, float]:
        return cached_model("m", {"seed": 0}, [], build, tmp_path / f"out{k}" / "m.safetensors")

    with ThreadPoolExecutor(4) as pool:  # flock excludes separate opens, threads included
        infos = list(pool.map(call, range(4)))
    assert len(builds) == 1 and infos == [{"test_accuracy": 0.5}] * 4
    for k in range(4):
        assert (tmp_path / f"out{k}" / "m.safetensors").read_bytes() == b"weights"
    # The build wrote to a temp dir, renamed into place: no temp dir is left behind.
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.is_dir()] == [
        f"m-{cache_key({'seed': 0}, [])}"
    ]

    cached_model("m", {"seed": 1}, [], build, tmp_path / "other.safetensors")
    assert len(builds) == 2  # other settings, another entry

    # An entry without its info.json (a writer killed before the rename cannot leave one,
    # but a hand-damaged cache can) is built again, not read.
    entry = tmp_path / "cache" / f"m-{cache_key({'seed': 0}, [])}"
    (entry / "info.json").unlink()
    call(9)
    assert len(builds) == 3 and (entry / "info.json").is_file()
    shutil.rmtree(tmp_path / "cache")


def test_the_key_changes_with_the_training_code(tmp_path: Path) -> None:
    code = ["tests/fixtures_models.py"]
    assert cache_key({"seed": 0}, code) != cache_key({"seed": 0}, [])
    assert cache_key({"seed": 0}, code) == cache_key({"seed": 0}, code)
    assert cache_key({"seed": 0}, code) != cache_key({"seed": 1}, code)
