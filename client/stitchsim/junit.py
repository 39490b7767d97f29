"""JUnit XML for CI dashboards: one test case per figure that was compared with the threshold.

The verdict figure is the minimum over directions of the mean agreement over all stitch points
and objectives of one protocol (the invariance-aware one when it ran). So the compared figures
are those per-direction means, as the engine reports them (`summary.by_direction`), and the
check passes exactly when each of them reaches the threshold; each becomes a test case whose
output breaks it down by objective and stitch point. A report without a verdict although a
threshold was given (a model at chance, say) becomes an erroring case that says why.
Test-case names leave out checkpoint hashes so CI tools can track them across runs.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import datetime, timezone

from stitchsim import catalogue, view
from stitchsim.gates import Outcome
from stitchsim.models import FigureRow, Report
from stitchsim.view import ComparedFigure, compared_figures

__all__ = ["compared_figures", "error_to_junit", "report_to_junit"]


def report_to_junit(
    report: Report, *, suite: str = "stitchsim", time_s: float | None = None,
    outcome: Outcome | None = None,
) -> str:
    """`outcome`: the check's gates beyond the threshold (baseline, points, warn band,
    caveats), each a test case; a warning passes, with WARN in its output and the suite's
    `status` property."""
    threshold = report.summary.threshold
    figures = compared_figures(report)
    suite_el, cases = _suite(suite, report, time_s)
    failures = 0

    for fig in figures:
        case = ET.SubElement(
            cases,
            "testcase",
            classname=f"stitchsim.{fig.protocol}",
            name=f"{fig.direction} mean agreement",
            time=f"{sum(r.seconds for r in fig.rows):.3f}",
        )
        breakdown = _breakdown(report, fig)
        if report.verdict is not None and threshold is not None and fig.mean_agreement < threshold:
            failures += 1
            ET.SubElement(
                case,
                "failure",
                type="BelowThreshold",
                message=(
                    f"mean agreement {fig.mean_agreement:.4f} < threshold {threshold:.4f} "
                    f"({fig.protocol}, {fig.direction})"
                ),
            ).text = breakdown
        ET.SubElement(case, "system-out").text = (
            f"mean agreement {fig.mean_agreement:.4f}"
            + (f" (threshold {threshold:.4f})" if threshold is not None else "")
            + "\n"
            + "".join(f"caveat: {c}\n" for c in report.verdict_caveats)
            + breakdown
        )

    # Each probe set a case of its own: its figures fail only through a gate (the gate cases).
    for line in view.probe_lines(report):
        case = ET.SubElement(cases, "testcase", classname=f"stitchsim.probe.{line.name}",
                             name=f"probe {line.name}", time="0")
        ET.SubElement(case, "system-out").text = view.probe_text(line) + "\n"

    # Never let the file pass while the service's verdict (and so the exit code) says fail.
    tests = len(figures) + len(report.probes)
    errors = 0
    if outcome is not None:
        tests, failures = tests + _gate_cases(cases, outcome), failures + sum(
            g.status == "fail" for g in outcome.gates if g.name != "threshold")
    if view.no_verdict_despite_threshold(report):
        tests += 1
        errors += 1
        case = ET.SubElement(cases, "testcase", classname="stitchsim", name="verdict", time="0")
        reason = report.verdict_reason or ""
        ET.SubElement(case, "error", type="NoVerdict", message=f"no verdict: {reason}"
                      ).text = reason
    elif report.verdict == "dissimilar" and failures == 0:
        tests += 1
        failures += 1
        case = ET.SubElement(cases, "testcase", classname="stitchsim", name="verdict", time="0")
        ET.SubElement(
            case,
            "failure",
            type="Dissimilar",
            message=f"verdict dissimilar: similarity {report.summary.similarity:.4f} "
            f"< threshold {threshold}",
        )
    _finish(suite_el, tests=tests, failures=failures, errors=errors)
    return _serialise(suite_el)


def _gate_cases(cases: ET.Element, outcome: Outcome) -> int:
    """One test case per gate but the threshold (the figures above are its cases)."""
    props = cases.find("properties")
    if props is not None:
        ET.SubElement(props, "property", name="status", value=outcome.status)
        if outcome.baseline_similarity is not None:
            ET.SubElement(props, "property", name="baseline_similarity",
                          value=f"{outcome.baseline_similarity:.4f}")
    gates = [g for g in outcome.gates if g.name != "threshold"]
    for gate in gates:
        case = ET.SubElement(cases, "testcase", classname="stitchsim.gates", name=gate.name,
                             time="0")
        if gate.status == "fail":
            ET.SubElement(case, "failure", type="GateFailed", message=gate.message
                          ).text = gate.message
        word = {"pass": "PASS", "warn": "WARN", "fail": "FAIL"}[gate.status]
        ET.SubElement(case, "system-out").text = f"{word}: {gate.message}\n"
    return len(gates)


def error_to_junit(
    message: str, *, kind: str, suite: str = "stitchsim", time_s: float | None = None
) -> str:
    """A JUnit file for a check that produced no report (service down, bad spec, timeout)."""
    suite_el, cases = _suite(suite, None, time_s)
    case = ET.SubElement(cases, "testcase", classname="stitchsim", name="check", time="0")
    ET.SubElement(case, "error", type=kind, message=message).text = message
    _finish(suite_el, tests=1, failures=0, errors=1)
    return _serialise(suite_el)


def _suite(name: str, report: Report | None, time_s: float | None) -> tuple[ET.Element, ET.Element]:
    root = ET.Element("testsuites", name=name)
    suite = ET.SubElement(
        root,
        "testsuite",
        name=name,
        timestamp=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S"),
        time=f"{time_s or 0.0:.3f}",
    )
    if report is not None:
        props = ET.SubElement(suite, "properties")
        s = report.summary
        for key, value in (
            ("job_id", report.job_id),
            ("front_checkpoint", report.front.checkpoint),
            ("back_checkpoint", report.back.checkpoint),
            ("front_accuracy", _four(report.front.accuracy)),
            ("back_accuracy", _four(report.back.accuracy)),
            ("similarity", f"{s.similarity:.4f}"),
            ("similarity_protocol", s.similarity_protocol),
            ("threshold", s.threshold),
            ("verdict", report.verdict),
            ("verdict_reason", report.verdict_reason),
            *((f"mean_agreement.{p}", f"{v:.4f}") for p, v in sorted(s.by_protocol.items())),
        ):
            if value is not None:
                ET.SubElement(props, "property", name=key, value=str(value))
    return root, suite


def _four(value: float | None) -> str | None:
    """A figure to four places; None (a model without classes has no accuracy) stays out."""
    return None if value is None else f"{value:.4f}"


def _finish(root: ET.Element, *, tests: int, failures: int, errors: int) -> None:
    counts = {"tests": str(tests), "failures": str(failures), "errors": str(errors)}
    root.attrib.update(counts)
    suite = root.find("testsuite")
    assert suite is not None
    suite.attrib.update(counts, skipped="0")
    root.set("time", suite.get("time", "0"))


def _breakdown(report: Report, fig: ComparedFigure) -> str:
    lines = [
        f"{row.objective}: mean agreement {row.mean_agreement:.4f}"
        for row in report.summary.rows
        if (row.protocol, row.direction) == (fig.protocol, fig.direction)
    ]
    columns = view.figure_columns(fig.rows)
    for p in fig.rows:
        figures = ", ".join(_figure(p, c) for c in columns if p.value(c.name) is not None)
        penalty = p.stitching_penalty
        lines.append(f"{p.objective} {p.front_layer} -> {p.back_layer}: {figures}"
                     + (f", stitching penalty {penalty:+.4f}" if penalty is not None else ""))
    return "\n".join(lines)


def _figure(row: FigureRow, column: catalogue.RowFigureEntry) -> str:
    """"agreement 0.6000 [0.5500, 0.6500]": four places, the interval where tables show it."""
    value, ci = row.value(column.name), row.interval(column.name)
    text = f"{column.label} {value:.4f}" + (f" {column.unit}" if column.unit else "")
    return text + (f" [{ci[0]:.4f}, {ci[1]:.4f}]" if column.interval_shown and ci else "")


def _serialise(root: ET.Element) -> str:
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
