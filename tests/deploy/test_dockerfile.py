"""Dockerfile.gpu without a Docker engine: stages, pins, and a gateway that carries no torch.

The gateway's install recipe is run here the way the image runs it (the heredoc script that
derives its requirements from pyproject.toml), its dependency closure is resolved from this
environment's installed metadata, and the gateway's code is imported with everything outside
that closure blocked: what would fail in the image fails here.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.deploy import dockerfile_lint as lint

DF = lint.load()
# The gateway installs the client package first, with its own dependencies.
CLIENT_DEPS = tomllib.loads((lint.REPO / "client/pyproject.toml").read_text())["project"][
    "dependencies"]
# The client's extras (pandas for Report.to_pandas, the dataset readers' packages): imported
# only when a user calls what needs them, which the gateway never does.
CLIENT_EXTRAS = {canonicalize_name(Requirement(r).name) for reqs in tomllib.loads(
    (lint.REPO / "client/pyproject.toml").read_text())["project"].get(
    "optional-dependencies", {}).values() for r in reqs}


def _gateway_requirements() -> list[str]:
    """Run the gateway stage's heredoc script as the build does: its output is what it installs."""
    scripts = [i for i in DF.stage("gateway").all("RUN") if i.heredoc]
    assert len(scripts) == 1
    env = {**os.environ, "GATEWAY_EXCLUDE": " ".join(sorted(lint.gateway_exclude(DF)))}
    out = subprocess.run([sys.executable, "-"], input=scripts[0].heredoc, text=True,
                         capture_output=True, cwd=lint.REPO, env=env, timeout=60, check=True)
    return [line for line in out.stdout.splitlines() if line.strip()]


def _closure(requirements: list[str]) -> set[str]:
    """Distribution names a pip install of these requirements brings (installed metadata)."""
    seen: set[str] = set()
    todo = [(Requirement(r), "") for r in requirements]
    while todo:
        req, extra = todo.pop()
        if req.marker and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        key = f"{name}[{','.join(sorted(req.extras))}]"
        if key in seen:
            continue
        seen.add(key)
        seen.add(name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a marker-less optional that this machine lacks: nothing to follow
        for sub in dist.requires or []:
            for ex in ("", *req.extras):
                todo.append((Requirement(sub), ex))
    return {s for s in seen if "[" not in s}


def test_dockerfile_lint_is_clean() -> None:
    assert lint.problems(DF) == []
    assert {"gateway", "worker"} <= set(DF.stages)
    assert lint.constraints_pins().keys() >= {"torch", "torchvision"}


def test_worker_cuda_matches_the_pinned_torch() -> None:
    """The base image's CUDA is the pinned torch's CUDA, where this machine has that build."""
    import torch

    pinned = lint.constraints_pins()["torch"]
    if torch.__version__.split("+")[0] != pinned or not torch.version.cuda:
        pytest.skip(f"this machine has torch {torch.__version__}, not the CUDA build of {pinned}")
    base = DF.resolve(DF.stage("worker").base, DF.stage("worker"))
    assert f"cuda:{torch.version.cuda}." in base, (base, torch.version.cuda)


def test_gateway_requirements_leave_the_compute_stack_out() -> None:
    reqs = _gateway_requirements()
    names = {canonicalize_name(Requirement(r).name) for r in reqs}
    assert {"fastapi", "uvicorn", "celery", "sqlalchemy", "psycopg", "s3fs"} <= names
    assert not names & (lint.TORCH_STACK | {"stitchsim"})
    closure = _closure(reqs + CLIENT_DEPS)
    assert not closure & lint.TORCH_STACK, sorted(closure & lint.TORCH_STACK)
    assert not {c for c in closure if c.startswith("nvidia-")}
    assert len(closure) > 40  # celery, fastapi, matplotlib, s3fs … really were followed


_GATEWAY_BLOCK = "RUN useradd --create-home --uid 10001 stitchsim && mkdir -p /data"


@pytest.mark.parametrize("edit, complaint", [
    (lambda t: t.replace(_GATEWAY_BLOCK, "RUN pip install torch\n" + _GATEWAY_BLOCK, 1),
     "is not constrained"),
    (lambda t: t.replace(_GATEWAY_BLOCK,
                         "RUN pip install -c constraints.txt timm\n" + _GATEWAY_BLOCK, 1),
     "gateway: installs ['timm']"),
    (lambda t: t.replace("--no-deps .", "."), "with its dependencies"),
    (lambda t: t.replace('EXCLUDE="torch torchvision timm', 'EXCLUDE="timm'), "GATEWAY_EXCLUDE"),
    (lambda t: t.replace("whl/cu130", "whl/cu126"), "does not match CUDA 13.0"),
    (lambda t: t.replace("runtime-ubuntu", "devel-ubuntu"), "not an nvidia/cuda runtime"),
    (lambda t: t.replace("-c constraints.txt --index-url", "--index-url"), "not constrained"),
    (lambda t: t.replace("torch torchvision\n", "torch==2.3.0 torchvision\n"), "written into"),
    (lambda t: t.replace("AS gateway", "AS api"), "no stage named gateway"),
    (lambda t: t.replace("import torch; assert torch.version.cuda",
                         "import torch; assert torch.cuda.is_available()"), "touches torch.cuda"),
    (lambda t: "".join(t.rsplit("USER stitchsim\n", 1)), "worker: runs as root"),
    (lambda t: t.replace("COPY service service", "COPY services service"), "no such path"),
    (lambda t: t.replace("STITCHSIM_CACHE_DIR=/cache", "STITCHSIM_CACHE=/cache"),
     "ENV STITCHSIM_CACHE is not a setting"),
])
def test_lint_catches_broken_variants(edit: Any, complaint: str) -> None:
    """The rules are not vacuous: each broken variant is caught, with a reason."""
    text = lint.DOCKERFILE.read_text()
    broken = edit(text)
    assert broken != text, "the edit did not apply: update the test with the Dockerfile"
    found = lint.problems(lint.parse(broken))
    assert any(complaint in p for p in found), found


def _third_party_imports(paths: list[Path]) -> set[str]:
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names
            and not n.startswith("stitchsim")}


def test_gateway_image_has_what_the_gateway_imports(tmp_path: Path) -> None:
    """Every import of service/ and the client (lazy ones too) is in the gateway's closure, and
    the gateway's code imports with everything else blocked."""
    closure = _closure(_gateway_requirements() + CLIENT_DEPS)
    closure |= {"stitchsim", "stitchsim-server"}
    dists = metadata.packages_distributions()
    sources = [*(lint.REPO / "service").rglob("*.py"),
               *(lint.REPO / "client/stitchsim").glob("*.py")]
    missing = {}
    for mod in _third_party_imports(sources):
        owners = {canonicalize_name(d) for d in dists.get(mod, [])}
        if owners <= CLIENT_EXTRAS:
            continue
        if owners and not owners & closure:  # not installed here at all = an optional fallback
            missing[mod] = sorted(owners)
    assert not missing, f"the gateway imports these, the gateway image lacks them: {missing}"

    # Import the gateway as the image runs it: its CLI (stitchsim-server gateway / keys), every
    # service module, the Redis transport, PostgreSQL and S3, with all else blocked.
    blocker = f"""
import importlib, importlib.abc, importlib.metadata as md, pkgutil, sys
allowed = set({sorted(closure)!r})
owners = md.packages_distributions()
norm = lambda n: n.lower().replace('_', '-').replace('.', '-')
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split('.')[0]
        dists = {{norm(d) for d in owners.get(top, [])}}
        if dists and not dists & allowed:
            raise ImportError(f'{{name}} ({{sorted(dists)}}) is not in the gateway image')
        return None
sys.meta_path.insert(0, Block())
import stitchsim_service, stitchsim_worker.cli
for m in pkgutil.walk_packages(stitchsim_service.__path__, 'stitchsim_service.'):
    importlib.import_module(m.name)
stitchsim_worker.cli.build_parser()
import kombu.transport.redis, redis, psycopg, s3fs, uvicorn, matplotlib.pyplot
from stitchsim_service.gateway.main import create_app
from stitchsim_service.core.settings import Settings
create_app(Settings(redis_url='redis://127.0.0.1:6379/0', data_dir=sys.argv[1]))
bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'timm', 'torchvision'))
assert not bad, bad
print('ok')
"""
    out = subprocess.run([sys.executable, "-c", blocker, str(tmp_path)],
                         capture_output=True, text=True, timeout=120, cwd=lint.REPO)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout + out.stderr
