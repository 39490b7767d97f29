"""A calibrated gate end to end against a real `stitchsim-server serve` (issue 46):
`stitchsim calibrate` on three benign retrains of the fixture recipe, then `stitchsim check
--gate` passing a retrain (through the GitHub Action's step) and failing a model that learned
nothing, and refusing, before any job, a check under another setting.

Kept cheap: the standard protocol only (no IRIs), one stitch point and direction, the ci
budget, 2 epochs of stitch training."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from stitchsim.gatefile import read_gate

from tests.client.test_gates_e2e import FakeGitHub, action, github  # noqa: F401  (fixture)

SPEC = ["--protocols", "standard", "--layers", "layer2", "--objectives", "slm",
        "--directions", "front_to_back", "--dataset", "digits", "--budget", "ci",
        "--set", "train.epochs=2"]
POINT = "agreement{direction=front_to_back,point=layer2->layer2,protocol=standard}"


def _cli(live_service: Any, *args: str, then: tuple[str, ...] = ()
         ) -> subprocess.CompletedProcess[str]:
    """`stitchsim ARGS` under SPEC, then `then` (a later --set overrides SPEC's)."""
    service = ["--url", live_service.url] + (
        ["--api-key", live_service.api_key] if live_service.api_key else [])
    return subprocess.run([sys.executable, "-m", "stitchsim.cli", *args, *service, *SPEC,
                           "--progress", "none", "--timeout", "400", *then],
                          capture_output=True, text=True, timeout=900)


def _jobs(live_service: Any) -> int:
    from stitchsim import Client

    with Client(live_service.url, live_service.api_key) as client:
        return len(list(client.iter_jobs()))


def test_calibrate_then_check_passes_a_retrain_fails_a_broken_model_refuses_a_misfit(
        live_service: Any, ckpts: Any, untrained: Any, tmp_path: Path,
        github: FakeGitHub) -> None:  # noqa: F811
    gate_path = tmp_path / "gate.json"
    benign = [str(ckpts.digits_resnet_b), str(ckpts.digits_resnet_c), str(ckpts.digits_resnet_d)]
    run = _cli(live_service, "calibrate", str(ckpts.digits_resnet), *benign, "-o",
               str(gate_path))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 benign retrains: each limit sits" in run.stderr  # fewer than 8: how wide
    gate = read_gate(gate_path.read_text(), "gate.json")
    assert gate.n == 3 and [b.given_as for b in gate.benign] == benign
    # The default: standard agreement at the one point and accuracy; the endpoint agreement
    # recorded beside them.
    gated = sorted(name for name, b in gate.figures.items() if b.gated)
    assert gated == ["accuracy", POINT]
    assert not gate.figures["endpoint_agreement{direction=front_to_back}"].gated
    band = gate.figures[POINT]
    assert band.sd > 0 and band.limit < band.min <= band.max <= 1.0
    assert gate.method.settings["protocols"] == ["standard"]
    assert f"{gate.gated_figures} gated figures" in run.stdout and POINT in run.stdout

    # A retrain the gate was set on passes (the bound is wide at n = 3), here through the
    # GitHub Action's step with its `gate` input.
    run, outputs = action(live_service, tmp_path, github, ckpts.digits_resnet,
                          ckpts.digits_resnet_b, gate=str(gate_path), args=" ".join(SPEC))
    assert run.returncode == 0 and outputs["status"] == "pass", run.stdout + run.stderr
    summary = (tmp_path / "summary.md").read_text().replace("\\|", "|")
    assert f"| calibrated {POINT} | ✅ PASS |" in summary
    assert "calibrated gate " in summary and "(3 benign retrains)" in summary

    # A model at its random init: chance accuracy, its outputs unlike the reference's.
    run = _cli(live_service, "check", str(ckpts.digits_resnet), str(untrained.back), "--gate",
               str(gate_path), "--markdown", str(tmp_path / "summary.md"))
    assert run.returncode == 1, run.stdout + run.stderr
    # "N benign sd below" where the retrains' accuracies differ; three retrains can tie on a
    # few hundred test images (sd 0), and then the distance in sd is left out.
    assert "fail: calibrated accuracy: " in run.stdout and "below the benign mean" in run.stdout
    assert "| calibrated accuracy | ❌ FAIL |" in (tmp_path / "summary.md").read_text()

    # Another stitch training: refused before any job is submitted, naming the setting.
    before = _jobs(live_service)
    run = _cli(live_service, "check", str(ckpts.digits_resnet), benign[0], "--gate",
               str(gate_path), then=("--set", "train.epochs=3"))
    assert run.returncode == 2, run.stdout + run.stderr
    assert "train.epochs: gate 2, this check 3" in run.stderr and "Traceback" not in run.stderr
    assert _jobs(live_service) == before
