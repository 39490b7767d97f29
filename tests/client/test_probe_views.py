"""A report's probe sets in every rendering and in the figures a gate reads (issue 47)."""

from __future__ import annotations

import pytest
from stitchsim.calibration import calibrate
from stitchsim.figures import report_figures
from stitchsim.gates import Outcome
from stitchsim.junit import report_to_junit
from stitchsim.markdown import outcome_markdown
from stitchsim.models import ProbeResult, Report
from stitchsim.table import format_table

from tests.client.test_calibration import benign


def with_probe(report: Report, agreement: float = 0.3) -> Report:
    rows = [r.model_copy(update={"figures": {**r.figures, "agreement": r.figures[
        "agreement"].model_copy(update={"value": agreement})}}) for r in report.results]
    ends = [u.model_copy(update={"figures": {**u.figures, "agreement": u.figures[
        "agreement"].model_copy(update={"value": 0.007})}})
        for u in report.unstitched_agreement]
    probe = ProbeResult(name="digits_marker_conflict", dataset={"n_test": 359},
                        front_accuracy=0.98, back_accuracy=0.04, unstitched_agreement=ends,
                        results=rows)
    return report.model_copy(update={"probes": [probe]})


def test_probe_figures_are_named_by_probe_beside_the_clean_ones() -> None:
    report = with_probe(benign()[0])
    figures = report_figures(report)
    clean = [n for n in report_figures(benign()[0])]
    probe = [n for n in figures if "probe=digits_marker_conflict" in n]
    assert all(n in figures for n in clean)
    # One per clean agreement, the endpoint per direction, the candidate's accuracy.
    agreements = [n for n in clean if n.startswith("agreement{")]
    assert len(probe) == len(agreements) + len(report.unstitched_agreement) + 1
    assert figures["accuracy{probe=digits_marker_conflict}"].value == 0.04
    assert all(figures[n].value == 0.3 for n in probe if n.startswith("agreement{"))


def test_a_gate_file_holds_each_probe_figure_and_gates_it_as_the_clean_ones() -> None:
    gate = calibrate([with_probe(r, 0.3 + i / 100) for i, r in enumerate(benign())])
    probe = {k: b for k, b in gate.figures.items() if "probe=" in k}
    assert probe and all(b.n == 8 for b in probe.values())
    gated = [k for k, b in probe.items() if b.gated]
    assert "accuracy{probe=digits_marker_conflict}" in gated
    assert all("protocol=standard" in k for k in gated if k.startswith("agreement{"))


def test_the_table_markdown_and_junit_show_the_probe() -> None:
    report = with_probe(benign()[0])
    table = format_table(report)
    assert "probe digits_marker_conflict (359 images): accuracy front 0.980, back 0.040" in table
    md = outcome_markdown(report, Outcome(gates=[], similarity=report.summary.similarity))
    assert "| digits_marker_conflict | 359 | 0.980 | 0.040 |" in md
    junit = report_to_junit(report)
    assert 'classname="stitchsim.probe.digits_marker_conflict"' in junit
    assert "candidate 0.040" in junit


def test_a_gate_calibrated_with_a_probe_refuses_a_check_without_it() -> None:
    from stitchsim.gatefile import GateRefused, evaluate, precheck

    def probed(r: Report) -> Report:
        spec = r.spec.model_copy(update={"probes": ["digits_marker_conflict"]})
        return with_probe(r).model_copy(update={"spec": spec})

    reports = benign()
    gate = calibrate([probed(r) for r in reports[1:]])
    candidate = reports[0]
    with pytest.raises(GateRefused, match="probes: gate"):
        evaluate(candidate, gate)
    with pytest.raises(GateRefused, match="probes: gate"):
        precheck(gate, "gate", None, None, {}, {"probes": ["digits_marker_swapped"]})
    precheck(gate, "gate", None, None, {}, {"probes": ["./my_probe/"]})  # compared after the run
    assert evaluate(probed(candidate), gate).status in ("pass", "fail", "warn")

