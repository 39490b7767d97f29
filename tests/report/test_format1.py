"""Reports of format 1 (figures as flat fields, before rows carried `figures`) still load,
verify, gate and render (docs/client.md, "The report JSON stays backward compatible"); a
report written now still carries the flat fields a format-1 client requires.

format1_report.json: a report the engine wrote before `figures` (two random-init
test_resnets, two stitch points, both directions; trimmed to four controls and two measure
controls, its digest taken again over what is left, as the engine takes it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from stitchsim.frames import report_records
from stitchsim.gates import baseline_from_file
from stitchsim.junit import report_to_junit
from stitchsim.models import Report
from stitchsim.models.report import FORMAT_1_FIGURES
from stitchsim.table import format_table
from stitchsim_service.gateway.pages import render_report_page

TEXT = (Path(__file__).parent / "format1_report.json").read_text()
FILE: dict[str, Any] = json.loads(TEXT)
ROWS = ("results", "controls", "unstitched_agreement")


@pytest.fixture(scope="module")
def report() -> Report:
    loaded, vouched = baseline_from_file(TEXT, "format1_report.json")
    assert vouched  # its digest, over the file's own JSON, still matches
    return loaded


def test_the_sample_is_format_1() -> None:
    assert all("figures" not in row and "agreement" in row for part in ROWS
               for row in FILE[part])


def test_every_flat_figure_is_read_into_figures(report: Report) -> None:
    seen = 0
    for part in ROWS:
        for flat, row in zip(FILE[part], getattr(report, part), strict=True):
            expected = {name: (flat[name], flat.get(f"{name}_ci")) for name in FORMAT_1_FIGURES
                        if flat.get(name) is not None}
            read = {name: (f.value, list(f.ci) if f.ci else None)
                    for name, f in row.figures.items()}
            assert read == expected
            seen += len(expected)
    assert seen == (16 + 4 + 2) * 6  # the six class figures on every row of logits


def test_it_renders_in_every_form(report: Report) -> None:
    first = FILE["results"][0]
    table = format_table(report)
    header = next(line for line in table.splitlines() if line.startswith("direction  "))
    assert "soft kappa" in header and "both r/w" in header
    assert f"{first['soft_kappa']:.3f}" in table
    page = render_report_page(report)
    assert "soft kappa" in page and f"{first['error_consistency']:.3f}" in page
    assert "agreement" in report_to_junit(report)
    record = report_records(report)[0]
    assert record["agreement"] == first["agreement"]
    assert [record["soft_kappa_ci_low"], record["soft_kappa_ci_high"]] == first["soft_kappa_ci"]
    assert "figures" not in record and "figures_agreement_value" not in record


def test_written_again_it_keeps_what_a_format_1_client_requires(report: Report) -> None:
    again = json.loads(report.model_dump_json())
    for flat, row in zip(FILE["results"], again["results"], strict=True):
        for name in ("agreement", "agreement_ci", "hard_agreement", "hard_agreement_ci",
                     "accuracy", "accuracy_ci", "error_consistency", "error_consistency_ci"):
            assert row[name] == flat[name], name
        assert row["figures"]["soft_kappa"] == {"value": flat["soft_kappa"],
                                                "ci": flat["soft_kappa_ci"]}
    assert Report.model_validate(again) == report
