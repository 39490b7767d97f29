"""Adding a measure is two entries (issue 27): a test package registers a toy measure's
catalogue entry and engine entry, and nothing else; a tiny job computes it, and the report,
the page and the table show it."""

from __future__ import annotations

import html
from collections.abc import Iterator
from pathlib import Path

import pytest
from stitchsim import catalogue
from stitchsim.models import Spec
from stitchsim.table import format_table
from stitchsim_service.gateway.pages import render_report_page
from stitchsim_worker.engine.measures.similarity import MEASURE_IMPLS

from tests import toy_measure
from tests.engine.jobs import layers, run, spec

TINY = {"epochs": 1, "max_train_samples": 64, "max_test_samples": 64}


@pytest.fixture
def plugged_in(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Both registries are put back as they were when the test ends.
    monkeypatch.setattr(catalogue.MEASURES, "entries", catalogue.MEASURES.entries)
    monkeypatch.delitem(MEASURE_IMPLS, toy_measure.NAME, raising=False)
    toy_measure.register()
    yield
    MEASURE_IMPLS.pop(toy_measure.NAME)  # not through monkeypatch: its undo would put it back


def test_a_measure_added_by_two_entries_is_computed_and_shown(
    ckpts, tmp_path: Path, plugged_in: None
) -> None:
    s = spec(ckpts.digits_resnet, ckpts.digits_resnet_b, objectives=["dm"],
             protocols=["standard"], layers=layers("layer3"), train=TINY,
             iri={"steps": 10, "extra_rounds": 0}, measures=["cka", toy_measure.NAME],
             measure_settings={"batch_size": 32})
    report = run(s, tmp_path)

    toy = [m for m in report.measures if m.measure == toy_measure.NAME]
    assert sorted(m.input for m in toy) == ["iri", "real"]
    for m in toy:
        assert -1.0 <= m.ci[0] <= m.value <= m.ci[1] <= 1.0 and m.samples == 64
    ceiling = [m for m in report.measure_controls
               if m.measure == toy_measure.NAME and m.control == "identity"]
    assert ceiling and abs(ceiling[0].value - 1.0) < 1e-9  # a representation with itself
    (summary,) = [m for m in report.summary.measures if m.measure == toy_measure.NAME]
    assert summary.real is not None and summary.iri is not None

    page = render_report_page(report)
    section = page[page.index('id="measures"'):]
    label = html.escape(toy_measure.CATALOGUE_ENTRY.label, quote=False)
    assert section.count(label) >= 3  # its plot panel, the summary table, the rows
    assert f"series-measure-front_to_back-{toy_measure.NAME}-iri" in section
    table = format_table(report)
    assert sum(toy_measure.NAME in line for line in table.splitlines()) == len(
        toy) + len([m for m in report.measure_controls if m.measure == toy_measure.NAME]) + 1


def test_without_its_entries_the_spec_refuses_the_name() -> None:
    assert toy_measure.NAME not in catalogue.MEASURES  # a fixture puts the catalogue back
    with pytest.raises(ValueError, match="Input should be 'cka' or 'mutual_knn'"):
        Spec.model_validate({"front": {"checkpoint": "sha256:" + "a" * 64},
                             "back": {"checkpoint": "sha256:" + "b" * 64},
                             "measures": [toy_measure.NAME]})
