"""The similarity measures in the terminal table and on the page (issue 14): a plot of the
measures versus depth beside agreement, with ceiling and floor, the sentence about the
real-versus-IRI gap, the tables; a report without measures shows none of it."""

from __future__ import annotations

import re

from stitchsim.models import DIRECTIONS, MeasureRow, Report
from stitchsim.table import format_table
from stitchsim_service.gateway.pages import render_report_page

from tests.report.sample import make_sample_report, summarise

REAL = (0.95, 0.92, 0.90)
IRI = {"front_to_back": (0.81, 0.62, 0.48), "back_to_front": (0.85, 0.70, 0.58)}


def _row(direction: str, fl: str, bl: str, measure: str, kind: str, value: float,
         **extra: object) -> MeasureRow:
    return MeasureRow(direction=direction, front_layer=fl, back_layer=bl,  # type: ignore[arg-type]
                      measure=measure, input=kind, value=value,  # type: ignore[arg-type]
                      ci=(value - 0.02, value + 0.02), samples=360,
                      split="test" if kind == "real" else "train", **extra)  # type: ignore[arg-type]


def _with_measures() -> Report:
    report = make_sample_report()
    pairs = list(dict.fromkeys((r.front_layer, r.back_layer) for r in report.results))
    rows, controls = [], []
    for d in DIRECTIONS:
        for k, (fl, bl) in enumerate(pairs):
            for name, scale in (("cka", 1.0), ("mutual_knn", 0.8)):
                rows.append(_row(d, fl, bl, name, "real", REAL[k] * scale))
                rows.append(_row(d, fl, bl, name, "iri", IRI[d][k] * scale))
                controls.append(_row(d, fl, bl, name, "real", 1.0, control="identity"))
                for kind in ("real", "iri"):
                    controls.append(_row(d, fl, bl, name, kind, 0.3 * scale,
                                         control="clustered_noise", sigma=0.1))
    summary = summarise(report.spec, report.results, report.controls, rows)
    return report.model_copy(update={"measures": rows, "measure_controls": controls,
                                     "summary": summary})


def test_the_page_plots_measures_beside_agreement_and_says_what_a_gap_means() -> None:
    report = _with_measures()
    page = render_report_page(report)
    assert page.index('id="agreement"') < page.index('id="measures"') < page.index(
        'id="controls"')
    section = page[page.index('id="measures"'):page.index('id="controls"')]
    assert "high on real inputs but lower on IRIs" in section
    # The summary's figures, in words: mean over the three points, and the weaker direction.
    assert "linear CKA 0.923 on real inputs, 0.637 on IRIs (gap +0.287)" in section
    assert "Weaker conditional on IRIs: linear CKA front → back" in section
    for d in DIRECTIONS:
        figure = re.search(rf'<figure class="plot" id="plot-measures-{d}" '
                           r'data-series="(\d+)">(.*?)</figure>', section, re.S)
        assert figure is not None, d
        # Agreement under each protocol and its unstitched endpoint, then each measure on
        # real inputs and on IRIs.
        protocols = {r.protocol for r in report.results}
        assert int(figure.group(1)) == len(protocols) + 1 + 2 * 2
        svg = figure.group(2)
        for gid in (f"series-agreement-{d}-slm-standard", f"series-unstitched-{d}-slm",
                    f"series-measure-{d}-cka-real",
                    f"series-measure-{d}-mutual_knn-iri", f"ref-measure-identity-{d}-cka",
                    f"ref-measure-clustered_noise-{d}-mutual_knn"):
            assert f'id="{gid}"' in svg, gid
    table = re.search(r'<table id="measures-table".*?</table>', section, re.S)
    assert table is not None
    assert table.group(0).count("<tr>") == 1 + len(report.measures) + len(report.measure_controls)


def test_the_terminal_table_lists_the_measures_and_the_weaker_conditional() -> None:
    text = format_table(_with_measures())
    lines = text.splitlines()
    start = lines.index("similarity measures (no fitting; real inputs vs the front model's IRIs)")
    end = lines.index("", start + 1)
    header, _, *rows = lines[start + 1:end]
    assert len(rows) == 2 * 3 * 2 * 5  # directions, points, measures, rows per measure
    assert len({len(line) for line in lines[start + 1:end]}) == 1  # aligned
    assert rows[0].split()[:6] == ["front->back", "layer1", "->", "layer1", "cka", "real"]
    assert "0.950 [0.930, 0.970]" in rows[0]
    assert "weaker conditional on IRIs: cka front->back, mutual_knn front->back" in lines
    assert lines[-1].startswith("VERDICT")


def test_a_report_without_measures_shows_none() -> None:
    report = make_sample_report()
    assert 'id="measures"' not in render_report_page(report)
    assert "similarity measures" not in format_table(report)
