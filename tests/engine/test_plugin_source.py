"""Operator plugins and the project's own architectures (issue 28): a distribution installed
into the worker's environment declares `stitchsim.architectures` entry points, and its
networks are compared like any other, by `plugin:NAME`; no uploaded code runs. The plugin is a
test package put on sys.path with its dist-info (as pip installs it), in a fresh interpreter
so this process's entry points stay as they are."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from stitchsim_worker.engine import list_stitch_points
from stitchsim_worker.engine.models import builtin
from stitchsim_worker.engine.models.loading import save_checkpoint
from torch import nn

from tests.engine.jobs import layers, rows, run, spec

REPO = Path(__file__).resolve().parents[2]
TINY = {"epochs": 1, "max_train_samples": 64, "max_test_samples": 64}

PLUGIN = '''
from torch import nn

class TinyNet(nn.Sequential):
    stitchsim_stages = ["block1", "block2"]
    stitchsim_preprocess = {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}

def build(num_classes=10, width=8):
    net = nn.Sequential()
    net.__class__ = TinyNet
    net.add_module("block1", nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU()))
    net.add_module("block2", nn.Sequential(nn.Conv2d(width, width, 3, 2, 1), nn.ReLU()))
    net.add_module("head", nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                         nn.Linear(width, num_classes)))
    return net
'''

CHILD = '''
import json, sys, torch
from pathlib import Path
from stitchsim_worker.engine import list_stitch_points
from stitchsim_worker.engine.models.loading import save_checkpoint
from stitchsim_worker.engine.models.sources.own import plugins
from tests.engine.jobs import layers, rows, run, spec
import acme_models

tmp = Path(sys.argv[1])
points = list_stitch_points("plugin:tinynet", {"num_classes": 10})
torch.manual_seed(0)
path = tmp / "tiny.safetensors"
save_checkpoint(acme_models.build(num_classes=10), path, "plugin:tinynet", {"num_classes": 10})
report = run(spec(path, path, objectives=["dm"], protocols=["standard"],
                  layers=layers("block1.0", "block2"),
                  train={"epochs": 1, "max_train_samples": 64, "max_test_samples": 64}), tmp)
print(json.dumps({"plugins": sorted(plugins()), "points": points,
                  "agreement": [r.agreement for r in rows(report, objective="dm")],
                  "source": report.front.source,
                  "preprocess": report.front.preprocess.model_dump(mode="json")}))
'''


def _install(site: Path) -> None:
    """What `pip install` of a distribution with one entry point leaves in site-packages."""
    (site / "acme_models").mkdir(parents=True)
    (site / "acme_models" / "__init__.py").write_text(PLUGIN)
    info = site / "acme_models-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-models\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[stitchsim.architectures]\ntinynet = acme_models:build\n")


def test_an_installed_plugin_architecture_is_listed_built_and_stitched(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _install(site)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["plugins"] == ["tinynet"]
    assert result["points"]["stages"] == ["block1", "block2"]
    assert "block1.0" in result["points"]["all"]  # inside a block
    assert result["source"] == "plugin"
    assert all(a >= 0.99 for a in result["agreement"]), result["agreement"]
    # Its declared normalisation is the first candidate measured.
    assert result["preprocess"]["candidates"][0]["name"] == "declared"


def test_without_the_plugin_installed_the_name_is_unknown() -> None:
    from stitchsim.failure import Failure

    with pytest.raises(Failure, match="not an operator plugin architecture"):
        list_stitch_points("plugin:tinynet", {})


def _tiny_autoencoder_classifier(num_classes: int = 10) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, 2, 1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, num_classes))


@pytest.fixture
def own_arch(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setattr(builtin, "_ARCHITECTURES", dict(builtin._ARCHITECTURES))
    builtin.register_architecture("test_tiny", _tiny_autoencoder_classifier)
    yield "stitchsim:test_tiny"


def test_the_projects_own_architectures_are_the_stitchsim_source(own_arch: str,
                                                                  tmp_path: Path) -> None:
    torch.manual_seed(0)
    path = tmp_path / "own.safetensors"
    save_checkpoint(_tiny_autoencoder_classifier(), path, own_arch, {})
    report = run(spec(path, path, objectives=["dm"], protocols=["standard"],
                      layers=layers("1", "3"), train=TINY), tmp_path)
    assert report.front.source == "stitchsim"
    assert all(r.agreement >= 0.99 for r in rows(report, objective="dm"))
