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


# ------------------------------------------------------------------ installs from anywhere

# The client's dependencies, by import name, lent from this environment to a fresh venv (a
# .pth file naming a folder of links to them): the installs below then need no index at all.
LENT = ("httpx", "httpcore", "h11", "anyio", "sniffio", "idna", "certifi", "pydantic",
        "pydantic_core", "typing_extensions", "annotated_types", "typing_inspection")
# Building from source without isolation needs the build backend in the target environment.
BACKEND = ("setuptools", "_distutils_hack")


def fresh_venv(root: Path, lend: tuple[str, ...]) -> Path:
    """A venv without pip whose site sees only the named modules of this environment."""
    import importlib.util

    venv.EnvBuilder(with_pip=False).create(root)
    lent = root / "lent"
    lent.mkdir()
    for name in lend:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue  # not installed here, so not needed by this stack (sniffio on new anyio)
        origin = Path(spec.origin)
        source = origin.parent if origin.name == "__init__.py" else origin
        (lent / source.name).symlink_to(source)
    # setuptools finds its commands (dist_info ...) by its distribution's entry points.
    from importlib.metadata import PackageNotFoundError, distribution

    for name in lend:
        try:
            info = Path(str(distribution(name)._path))  # type: ignore[attr-defined]
        except PackageNotFoundError:
            continue
        if info.is_dir() and not (lent / info.name).exists():
            (lent / info.name).symlink_to(info)
    [site] = (root / "lib").glob("python3*/site-packages")
    (site / "lent.pth").write_text(str(lent) + "\n")
    return root / "bin" / "python"


def probe_installed(python: Path, env_dir: Path, live_service: Any) -> None:
    probe = run(python, "-c",
                "import stitchsim, stitchsim.gates, stitchsim.markdown\n"
                "from stitchsim import AsyncClient, Client\n"
                "print(stitchsim.__file__)")
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip().startswith(str(env_dir))  # the installed copy
    cli = env_dir / "bin" / "stitchsim"
    assert run(cli, "--version").stdout.strip() == "stitchsim 0.1.0"
    key = ["--api-key", live_service.api_key] if live_service.api_key else []
    jobs = run(cli, "jobs", "--json", "--url", live_service.url, *key)
    assert jobs.returncode == 0, jobs.stderr
    assert "items" in json.loads(jobs.stdout)
    assert run(python, "-c", "import torch").returncode != 0


def test_the_client_installs_from_a_git_url_subdirectory(tmp_path: Path,
                                                         live_service: Any) -> None:
    """`pip install git+URL#subdirectory=client`, as a CI job of another repository does."""
    clone = tmp_path / "repo"
    # Not shallow: pip clones it again with a filter, which a shallow source never answers.
    cloned = subprocess.run(["git", "clone", "-q", "--single-branch", f"file://{REPO}", str(clone)],
                            capture_output=True, text=True, timeout=120)
    assert cloned.returncode == 0, cloned.stderr
    env_dir = tmp_path / "fresh"
    python = fresh_venv(env_dir, LENT + BACKEND)
    installed = pip("install", "--no-deps", "--no-index", "--no-build-isolation",
                    f"stitchsim @ git+file://{clone}#subdirectory=client", python=python)
    assert installed.returncode == 0, installed.stderr
    probe_installed(python, env_dir, live_service)


def test_the_client_builds_as_a_wheel_that_installs_alone(tmp_path: Path,
                                                           live_service: Any) -> None:
    """`python -m build client`, then the wheel alone in a fresh venv (its dependencies lent,
    no build backend there)."""
    import shutil

    source = tmp_path / "client"
    shutil.copytree(REPO / "client", source, ignore=shutil.ignore_patterns(
        "build", "dist", "*.egg-info", "__pycache__"))
    built = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                            "--outdir", str(tmp_path / "dist"), str(source)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    [wheel] = (tmp_path / "dist").glob("stitchsim-0.1.0-py3-none-any.whl")
    env_dir = tmp_path / "fresh"
    python = fresh_venv(env_dir, LENT)
    installed = pip("install", "--no-deps", "--no-index", str(wheel), python=python)
    assert installed.returncode == 0, installed.stderr
    probe_installed(python, env_dir, live_service)
    # The extras are declared for pip to resolve where an index is reachable.
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read("stitchsim-0.1.0.dist-info/METADATA").decode()
    assert 'Provides-Extra: pandas' in meta and 'Provides-Extra: data' in meta
