"""`stitchsim check --gate FILE`: the calibrated gate read and refused before anything runs
where it does not fit the check, then applied to the report beside the other gates."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from stitchsim.calibration import GateFile
from stitchsim.cli.baseline import planned_settings, reference_id
from stitchsim.gatefile import GateRefused, gate_results, precheck, read_gate, refuse_unless_fits
from stitchsim.gates import Outcome
from stitchsim.models import Report
from stitchsim.sdk.client import ID_RE


def load(name: str, reference: str, fields: dict[str, Any]) -> GateFile:
    path = Path(name)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise GateRefused(f"--gate: no such file {name}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise GateRefused(f"--gate: cannot read {name} ({exc})") from None
    gate = read_gate(text, f"file {name}")
    dataset = fields.get("dataset")
    known = dataset if isinstance(dataset, str) and (
        ID_RE.match(dataset) or not Path(dataset).exists()) else None
    # A model folder is packed before its id is known: its reference is compared after the run.
    ref_id = None if Path(reference).is_dir() else reference_id(reference)
    precheck(gate, f"file {name}", ref_id, known, planned_settings(fields), fields)
    return gate


def apply(outcome: Outcome, report: Report, gate: GateFile, name: str) -> Outcome:
    """The outcome with every gated figure's test added (refused unless the gate fits what
    ran: the engine's version and the settings resolved at run time)."""
    refuse_unless_fits(gate, report, f"file {name}")
    return replace(outcome, gates=[*outcome.gates, *gate_results(report, gate)],
                   baseline_source=outcome.baseline_source or f"gate {name} ({gate.n} benign "
                   "retrains)")
