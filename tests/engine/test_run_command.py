"""`stitchsim-server run`: one job in-process, report to a file, errors as exit code 2."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from stitchsim.models import Report


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "stitchsim_worker.cli", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)


def _spec(tmp_path: Path, ckpts, **fields: object) -> Path:  # type: ignore[no-untyped-def]
    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    shutil.copy(ckpts.digits_resnet, models / "a.safetensors")
    body = {
        "front": {"checkpoint": {"path": "models/a.safetensors"}},
        "back": {"checkpoint": {"path": "models/a.safetensors"}},
        "layers": [{"front": "layer3", "back": "layer3"}],
        "objectives": ["dm"],
        "protocols": ["standard"],
        "directions": "front_to_back",
        "train": {"max_train_samples": 200, "max_test_samples": 100},
        "threshold": 0.9,
        **fields,
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(body))
    return path


def test_run_writes_the_report_and_prints_the_table(ckpts, tmp_path: Path) -> None:
    spec = _spec(tmp_path, ckpts)
    out = tmp_path / "report.json"
    # Run from elsewhere: checkpoint paths are relative to the spec file.
    done = _run(
        "run",
        str(spec),
        "--out",
        str(out),
        "--quiet",
        "--cache-dir",
        str(tmp_path / "c"),
        cwd=Path("/"),
    )
    assert done.returncode == 0, done.stderr
    report = Report.model_validate_json(out.read_text())
    assert report.verdict == "similar"
    assert report.results[0].agreement > 0.98
    assert report.spec.train.epochs == 10  # defaults filled in
    assert "layer3" in done.stdout and "similar" in done.stdout


def test_run_explains_bad_specs_with_exit_code_2(ckpts, tmp_path: Path) -> None:
    spec = _spec(tmp_path, ckpts, layers=[{"front": "layer9", "back": "layer3"}])
    done = _run("run", str(spec), "--quiet", cwd=tmp_path)
    assert done.returncode == 2
    assert "no stitch point 'layer9'" in done.stderr and "layer1, layer2" in done.stderr
    assert "Traceback" not in done.stderr

    spec = _spec(tmp_path, ckpts, objectives=["mse"])
    done = _run("run", str(spec), "--quiet", cwd=tmp_path)
    assert done.returncode == 2
    # The words the client and the service use for the same spec (stitchsim.validation).
    assert ("error: invalid spec: objectives.0: Input should be 'hlm', 'slm', 'dm' or 'fula' "
            "(invalid_spec)") in done.stderr


def test_points_lists_stage_outputs(tmp_path: Path) -> None:
    done = _run("points", "test_convnext", cwd=tmp_path)
    assert done.returncode == 0
    assert done.stdout.split() == ["stages.0", "stages.1", "stages.2", "stages.3"]
