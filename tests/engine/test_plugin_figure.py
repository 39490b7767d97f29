"""Adding a row figure is two entries (issue 39): a test package registers a toy figure's
catalogue entry and engine entry, and nothing else; a tiny job computes it on every row and on
the no-stitch endpoint, and the table, the page, JUnit and the data frame show it."""

from __future__ import annotations

import html
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from stitchsim import catalogue
from stitchsim.frames import report_records
from stitchsim.junit import report_to_junit
from stitchsim.models import Report
from stitchsim.table import format_table
from stitchsim_service.gateway.pages import render_report_page
from stitchsim_worker.engine import Resources
from stitchsim_worker.engine.job.prepare import prepare
from stitchsim_worker.engine.measures.metrics import FIGURES

from tests import toy_figure
from tests.engine.jobs import TINY, run, spec

NAME = toy_figure.NAME


@pytest.fixture
def plugged_in(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Both registries are put back as they were when the test ends.
    monkeypatch.setattr(catalogue.ROW_FIGURES, "entries", catalogue.ROW_FIGURES.entries)
    monkeypatch.delitem(FIGURES, NAME, raising=False)
    toy_figure.register()
    yield
    FIGURES.pop(NAME)  # not through monkeypatch: its undo would put the entry back


def _job(untrained: Any, tmp_path: Path) -> tuple[Report, float]:
    """A one-point job of two random inits, and the toy figure of the two whole models
    written out here from their logits on the job's test split."""
    s = spec(untrained.front, untrained.back, layers=[{"front": "layer2", "back": "layer2"}],
             objectives=["dm"], protocols=["standard"], train=TINY, threshold=0.5)
    report = run(s, tmp_path)
    prep = prepare(s, Resources(cache_dir=tmp_path / "direct"), torch.device("cpu"))
    pixels, labels = prep.data.test.pixels.all(), prep.data.test.labels
    with torch.no_grad():
        f_right = prep.front.logits(pixels).argmax(1) == labels
        g_right = prep.back.logits(pixels).argmax(1) == labels
    return report, float((f_right & ~g_right).float().mean())


def test_a_figure_added_by_two_entries_is_computed_and_shown(
    untrained: Any, tmp_path: Path, plugged_in: None
) -> None:
    report, by_hand = _job(untrained, tmp_path)
    (end,) = report.unstitched_agreement
    assert end.value(NAME) == pytest.approx(by_hand)
    for row in [*report.results, end]:
        low, high = row.interval(NAME) or (2.0, -1.0)
        assert 0.0 <= low <= row.value(NAME) <= high <= 1.0  # type: ignore[operator]
        assert list(row.figures)[-1] == NAME  # the catalogue's order: registered last
    assert Report.model_validate_json(report.model_dump_json()) == report

    table = format_table(report)
    assert table.count("toy right") == 2  # the results' header and the endpoint's
    assert f"{by_hand:.4f}" in table  # its own digits
    page = render_report_page(report)
    assert html.escape(toy_figure.CATALOGUE_ENTRY.description, quote=False) in page
    assert page.count("<th") and "toy right" in page
    junit = report_to_junit(report)
    assert f"{toy_figure.CATALOGUE_ENTRY.label} {report.results[0].value(NAME):.4f}" in junit
    (record,) = report_records(report)
    assert record[NAME] == report.results[0].value(NAME)
    assert (record[f"{NAME}_ci_low"], record[f"{NAME}_ci_high"]) == report.results[0].interval(NAME)


def test_a_figure_this_client_does_not_know_is_shown_under_its_name(
    untrained: Any, tmp_path: Path, plugged_in: None
) -> None:
    """A newer service's figure: the client reads and shows it without its catalogue entry."""
    text = _job(untrained, tmp_path)[0].model_dump_json()
    catalogue.ROW_FIGURES.entries = tuple(e for e in catalogue.ROW_FIGURES if e.name != NAME)
    report = Report.model_validate_json(text)
    assert NAME in report.results[0].figures
    header = next(line for line in format_table(report).splitlines() if "penalty" in line)
    assert header.split()[-2:] == [NAME, "penalty"]
    assert NAME in render_report_page(report)
