"""A calibrated gate file read, checked against a check, and applied to its report.

Reading refuses what the calibration did not write: text that is not JSON or nests deeper than
any gate does, Infinity/NaN, fields out of bounds, n below the minimum, a digest that no longer
matches (an edit by hand). A gate is valid for one reference, dataset, spec and method: a
check that differs in any is refused, before it runs where the client can tell (the reference's
hash, the dataset's name, the planned settings), else once the report names what ran, as a
baseline is (stitchsim.gates).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from stitchsim.calibration import GateFile, dataset_of, spec_of
from stitchsim.datasets import BUILTIN
from stitchsim.errors import UsageError
from stitchsim.figures import report_figures
from stitchsim.gates import BenignBand, Gate, Outcome, method_of
from stitchsim.jsondepth import JSONInputError, parse_json
from stitchsim.method import differences, planned_differences
from stitchsim.models import Report
from stitchsim.models.report import report_digest
from stitchsim.probes import BUILTIN_PROBES
from stitchsim.validation import field_errors, summary

MAX_GATE_BYTES = 16 * 1024 * 1024
"""A gate of 64 stitch points x 4 protocols x 2 directions over 100 retrains is under 1 MB."""
SPEC_BEYOND_METHOD = ("measures", "measure_settings", "class_pairing", "probes")
"""Spec fields that decide which figures a check reports without moving the similarity (so
they are not in the method record), and that a gate therefore must share."""
_BEFORE = {"probes": []}
"""What a gate file written before a field existed held for it."""
_EPS = 1e-9


class GateRefused(UsageError):
    """The gate file is not what `stitchsim calibrate` wrote, or was calibrated for another
    reference, dataset, spec or method than this check's."""

    code = "gate_refused"


def read_gate(text: str, name: str) -> GateFile:
    """A gate file's content, refused (GateRefused) unless it is a gate as calibrated."""
    if len(text) > MAX_GATE_BYTES:
        raise GateRefused(f"gate {name} is larger than {MAX_GATE_BYTES:,} bytes: not a gate "
                          "file `stitchsim calibrate` writes")
    try:
        data: Any = parse_json(text, f"gate {name}")
    except JSONInputError as exc:
        raise GateRefused(f"{str(exc)[:200]}: not a gate file `stitchsim calibrate` writes; "
                          "it was truncated or edited: calibrate again") from None
    if not isinstance(data, dict):
        raise GateRefused(f"gate {name} must hold a JSON object")
    try:
        gate = GateFile.model_validate(data)
    except ValidationError as exc:
        fields = field_errors(exc.errors())
        raise GateRefused(f"gate {name} is not a stitchsim gate file ({summary(fields, shown=3)})"
                          "; use the file `stitchsim calibrate` wrote", details=fields) from None
    if gate.digest is None or report_digest(data) != gate.digest:
        raise GateRefused(f"gate {name} was changed after `stitchsim calibrate` wrote it: its "
                          "content no longer matches its digest (a limit, a figure or a "
                          "setting edited by hand); calibrate again")
    _consistent(gate, name)
    return gate


def _consistent(gate: GateFile, name: str) -> None:
    """Counts that a digest alone would not catch in a file written by another program."""
    wrong = [k for k, b in gate.figures.items() if b.n != gate.n or len(b.values) != gate.n]
    if len(gate.benign) != gate.n or wrong:
        raise GateRefused(f"gate {name}: its counts disagree (n {gate.n}, "
                          f"{len(gate.benign)} benign models, figures {wrong[:3]})")
    gated = sum(b.gated for b in gate.figures.values())
    if gated != gate.gated_figures:
        raise GateRefused(f"gate {name}: {gated} figures marked gated, the rate was split over "
                          f"{gate.gated_figures}")


# ------------------------------------------------------------------ does it fit the check


def precheck(gate: GateFile, source: str, reference: str | None, dataset: str | None,
             planned: dict[str, Any], fields: dict[str, Any]) -> None:
    """Refuse, before anything runs, a gate of another reference, dataset or planned method
    (`planned`: stitchsim.cli.baseline.planned_settings of the check's fields)."""
    found = []
    if reference is not None and gate.reference.checkpoint != reference:
        found.append(f"reference model: gate {gate.reference.checkpoint}, this check {reference}")
    if dataset is not None and gate.dataset != dataset:
        found.append(f"dataset: gate {gate.dataset}, this check {dataset}")
    if planned:
        found += _worded(planned_differences(gate.method.settings, planned))
    for key in SPEC_BEYOND_METHOD:
        if key == "probes" and not _named_probes(fields.get(key)):
            continue  # files still to upload: compared by id once the check has run
        if key in fields and fields[key] != _gate_spec(gate, key):
            found.append(f"{key}: gate {_gate_spec(gate, key)}, this check {fields[key]}")
    _refuse(source, found)


def _gate_spec(gate: GateFile, key: str) -> Any:
    return gate.spec.get(key, _BEFORE.get(key))


def _named_probes(probes: Any) -> bool:
    """Whether every probe is given by a name or id the gate file can hold as it is."""
    return isinstance(probes, list) and all(
        isinstance(p, str) and (p in BUILTIN_PROBES or p in BUILTIN or p.startswith("sha256:"))
        for p in probes)


def refuse_unless_fits(gate: GateFile, report: Report, source: str) -> None:
    """Refuse a gate whose reference, dataset, spec or method is not the report's."""
    found = []
    if gate.reference.checkpoint != report.front.checkpoint:
        found.append(f"reference model: gate {gate.reference.checkpoint}, this check "
                     f"{report.front.checkpoint}")
    if gate.dataset != dataset_of(report):
        found.append(f"dataset: gate {gate.dataset}, this check {dataset_of(report)}")
    found += _worded(differences(gate.method, method_of(report)))
    spec = spec_of(report)
    found += [f"{k}: gate {_gate_spec(gate, k)}, this check {spec.get(k)}"
              for k in SPEC_BEYOND_METHOD if _gate_spec(gate, k) != spec.get(k)]
    _refuse(source, found)


def _worded(found: list[str]) -> list[str]:
    """stitchsim.method's "x: baseline A, this check B" as "x: gate A, this check B"."""
    return [line.replace(": baseline ", ": gate ", 1) for line in found]


def _refuse(source: str, found: list[str]) -> None:
    if found:
        raise GateRefused(f"gate {source} was calibrated for another check: " + "; ".join(found)
                          + ". Calibrate a gate under this check's reference, dataset and "
                          "settings (`stitchsim calibrate`)")


# ------------------------------------------------------------------ evaluation


def gate_results(report: Report, gate: GateFile) -> list[Gate]:
    """One pass/fail per gated figure: the candidate's value against its benign limit."""
    figures = report_figures(report)
    out = []
    for name, b in gate.figures.items():
        if not b.gated:
            continue
        figure = figures.get(name)
        if figure is None:
            out.append(Gate(f"calibrated {name}", "fail", "this check reports no such figure "
                            "(the gate was calibrated with it)"))
            continue
        value = figure.value
        ok = value >= b.limit - _EPS if b.bad == "low" else value <= b.limit + _EPS
        away = "" if b.sd == 0 else f"{abs(value - b.mean) / b.sd:.1f} benign sd "
        side = "below" if value < b.mean else "above"
        relation = (">=" if ok else "<") if b.bad == "low" else ("<=" if ok else ">")
        message = (f"{value:.4f} {relation} limit {b.limit:.4f}: {away}{side} the benign mean "
                   f"{b.mean:.4f} "
                   f"(sd {b.sd:.4f}, n {b.n}; limit at {gate.limit_in_sd:.1f} sd)")
        out.append(Gate(f"calibrated {name}", "pass" if ok else "fail", message, value, b.limit,
                        BenignBand(b.mean, b.sd, b.min, b.max, b.n)))
    return out


def evaluate(report: Report, gate: GateFile, *, source: str = "gate") -> Outcome:
    """The check's outcome under a calibrated gate: refused (GateRefused) unless the gate fits
    the report; every gated figure against its limit."""
    refuse_unless_fits(gate, report, source)
    return Outcome(gate_results(report, gate), report.summary.similarity,
                   baseline_source=f"{source} ({gate.n} benign retrains)")
