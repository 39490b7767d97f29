"""The figures of the adversarial, cross-task and unseen-cue protocols (issue 15) in the
terminal table and on the page: robust agreement beside the clean one (with the attack, its
transfer rate and the row's alpha, issue 26), one control row per
cue, the excessive agreement's maximum over stitch points, and the report's notes."""

from __future__ import annotations

from stitchsim.models import ExcessRow, Figure, Report, RobustStats
from stitchsim.table import format_table
from stitchsim_service.gateway.pages import render_report_page

from tests.report.sample import make_sample_report

NOTE = "cross-task: agreement measures compatibility, not shared meaning"


CAPTION = "AutoAttack (APGD-CE + APGD-DLR) as the paper ran it at epsilon 8/255, 20 steps of 2/255"


def _report() -> Report:
    report = make_sample_report()
    first = report.results[0]
    adversarial = first.model_copy(update={
        "protocol": "adversarial", "alpha": 1.0,
        "figures": {**first.figures, "agreement": Figure(value=0.91, ci=(0.88, 0.94))},
        "robust": RobustStats(agreement=0.137, agreement_ci=(0.1, 0.17), hard_agreement=0.2,
                              accuracy=0.05, back_accuracy=0.96, epsilon=8 / 255, steps=20,
                              attack="autoattack_paper", step_size=2 / 255, success_rate=0.94,
                              transfer_rate=0.023),
    })
    cue = report.controls[0].model_copy(update={
        "control": "shortcut", "cue": "pixel_specific", "excessive_agreement": 0.412,
        "rolled_agreement": 0.5,
    })
    excess = ExcessRow(direction="front_to_back", cue="pixel_specific", protocol="standard",
                       objective="slm", max_excessive_agreement=0.412,
                       front_layer=first.front_layer, back_layer=first.back_layer)
    summary = report.summary.model_copy(update={"excessive_agreement": [excess]})
    return report.model_copy(update={
        "results": [*report.results, adversarial], "controls": [*report.controls, cue],
        "summary": summary, "notes": [NOTE],
    })


def test_the_table_shows_robust_agreement_cues_excess_and_notes() -> None:
    text = format_table(_report())
    header = next(line for line in text.splitlines() if line.startswith("direction"))
    assert header.endswith("robust agr  transfer")
    assert any("adversarial a=1" in line and line.endswith("0.137     0.023")
               for line in text.splitlines())
    # The attack is named, with its budget: robust agreement means nothing without it.
    assert CAPTION in text
    assert "shortcut:pixel_specific" in text
    block = text.split("excessive agreement (unseen cues), max over stitch points")[1]
    assert "pixel_specific" in block and "0.412" in block
    assert NOTE in text.split("notes")[1]
    assert text.splitlines()[-1].startswith("VERDICT")


def test_without_robust_rows_there_is_no_robust_column() -> None:
    text = format_table(make_sample_report())
    assert "robust agr" not in text and "excessive agreement" not in text


def test_the_page_shows_the_same() -> None:
    page = render_report_page(_report())
    assert "robust agr." in page and "0.137" in page and "0.023" in page
    assert CAPTION in page
    assert "adversarial, α = 1" in page
    assert "unseen cues: class colour, class place" in page
    assert 'id="excess-table"' in page and "0.412" in page
    assert 'id="notes"' in page and NOTE in page
    assert "robust agr." not in render_report_page(make_sample_report())
