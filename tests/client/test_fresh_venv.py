"""The client installs alone: a fresh virtualenv with `pip install ./client` has no torch.

Dependencies are installed from a local wheelhouse (`.whl/client/`, git-ignored) with
`--no-index`, filled from the package index only the first time, so the test is fast and
does not depend on the index once it has run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
WHEELHOUSE = REPO / ".whl" / "client"
# Pinned to what the project's own environment runs, so both test the same client stack.
DEPENDENCIES = [f"httpx=={version('httpx')}", f"pydantic=={version('pydantic')}"]
SERVER_SIDE = {
    "torch", "torchvision", "timm", "celery", "kombu", "fastapi", "starlette", "uvicorn",
    "numpy", "safetensors", "sqlalchemy", "redis", "matplotlib", "stitchsim-server",
}  # fmt: skip


def pip(*args: str, python: Path | None = None) -> subprocess.CompletedProcess[str]:
    target = ["--python", str(python)] if python else []
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *target, *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def run(*cmd: str | Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=120, env=env, cwd="/"
    )


def test_fresh_venv_runs_the_client_without_torch(tmp_path: Path, live_service: Any) -> None:
    wheels = tmp_path / "wheels"
    built = pip(
        "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(REPO / "client")
    )
    assert built.returncode == 0, built.stderr
    [wheel] = wheels.glob("stitchsim-*.whl")

    env_dir = tmp_path / "fresh"
    # The outer pip installs into it (--python), which saves bootstrapping pip in the venv.
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"

    def install() -> subprocess.CompletedProcess[str]:
        return pip("install", "--no-index", "--find-links", str(WHEELHOUSE), str(wheel),
                   python=python)  # fmt: skip

    installed = install()
    if installed.returncode != 0:
        fetched = pip("download", "--dest", str(WHEELHOUSE), "--only-binary", ":all:",
                      *DEPENDENCIES)  # fmt: skip
        if fetched.returncode != 0:
            pytest.skip(
                f"no wheelhouse at {WHEELHOUSE} and the package index is unreachable: "
                f"{fetched.stderr.strip()[-300:]}"
            )
        installed = install()
    assert installed.returncode == 0, installed.stderr

    listed = pip("list", "--format", "json", python=python)
    assert listed.returncode == 0, listed.stderr
    names = {d["name"].lower().replace("_", "-") for d in json.loads(listed.stdout)}
    assert {"stitchsim", "httpx", "pydantic"} <= names
    assert not names & SERVER_SIDE, names & SERVER_SIDE

    no_torch = run(python, "-c", "import torch")
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr

    probe = run(
        python,
        "-c",
        "import json, sys, time\n"
        "t = time.perf_counter()\n"
        "import stitchsim, stitchsim.cli, stitchsim.table, stitchsim.junit\n"
        "print(json.dumps({'seconds': time.perf_counter() - t, 'file': stitchsim.__file__,\n"
        "                  'top': sorted({m.split('.')[0] for m in sys.modules})}))",
    )
    assert probe.returncode == 0, probe.stderr
    info = json.loads(probe.stdout)
    assert info["file"].startswith(str(env_dir))  # the installed copy, not the checkout
    assert not set(info["top"]) & {"torch", "numpy", "timm", "celery", "fastapi",
                                   "stitchsim_worker", "stitchsim_service"}  # fmt: skip
    assert info["seconds"] < 5.0

    cli = env_dir / "bin" / "stitchsim"
    assert run(cli, "--version").stdout.strip() == "stitchsim 0.1.0"
    # And it talks to a real service.
    key = ["--api-key", live_service.api_key] if live_service.api_key else []
    jobs = run(cli, "jobs", "--json", "--url", live_service.url, *key)
    assert jobs.returncode == 0, jobs.stderr
    assert "items" in json.loads(jobs.stdout)

    # Packing a dataset needs the data extra, and says how to get it (before reading a byte).
    (tmp_path / "pets" / "cat").mkdir(parents=True)
    packed = run(cli, "dataset", "pack", tmp_path / "pets", tmp_path / "pets.safetensors")
    assert packed.returncode == 2, packed.stderr
    assert "pip install 'stitchsim[data]'" in packed.stderr and "Traceback" not in packed.stderr
    assert not (tmp_path / "pets.safetensors").exists()
