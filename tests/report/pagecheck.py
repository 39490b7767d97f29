"""What a rendered report page must show, derived from the JSON report alone (not from the
page code), and the checks of a page loaded in Chromium against it."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from tests.report.chromium import Page

IRI_STATS = ("start_median", "median", "p90", "max")


def expected_series(report: dict[str, Any]) -> dict[str, dict[str, int]]:
    """plot id -> {series id: number of points}: one agreement line per (direction,
    objective, protocol) with a point per stitch pair, the endpoint (unstitched models) once
    per agreement panel, and four IRI lines per direction that
    ran the invariance-aware protocol, with a point per layer the stitch reads from (the
    front model's in front_to_back, the back model's in back_to_front)."""
    plots: dict[str, dict[str, int]] = defaultdict(dict)
    iri_points: dict[str, set[str]] = defaultdict(set)
    for row in report["results"]:
        d, o, p = row["direction"], row["objective"], row["protocol"]
        series = plots[f"plot-agreement-{d}"]
        key = f"series-agreement-{d}-{o}-{p}"
        series[key] = series.get(key, 0) + 1
        if row.get("iri") is not None:
            iri_points[d].add(row["front_layer" if d == "front_to_back" else "back_layer"])
    # Each agreement panel (one per objective) ends in the unstitched models: one marker.
    for end in report.get("unstitched_agreement", []):
        d = end["direction"]
        for o in {row["objective"] for row in report["results"] if row["direction"] == d}:
            plots[f"plot-agreement-{d}"][f"series-unstitched-{d}-{o}"] = 1
    for d, layers in iri_points.items():
        for stat in IRI_STATS:
            plots[f"plot-iri-{d}"][f"series-iri-{d}-{stat}"] = len(layers)
    return dict(plots)


# Each series is a matplotlib line with a gid: a <g id=series-...> holding the line's path
# and one <use> per marker, so counting <use> counts the plotted points.
_SERIES_JS = """
(() => {
  const out = {};
  for (const fig of document.querySelectorAll('figure.plot')) {
    const series = {};
    for (const g of fig.querySelectorAll('[id^="series-"]')) {
      series[g.id] = g.querySelectorAll('use').length;
    }
    out[fig.id] = {series, declared: Number(fig.dataset.series),
                   titled: !!fig.querySelector('svg[role="img"] > title'),
                   width: fig.querySelector('svg').getBoundingClientRect().width};
  }
  return out;
})()
"""


def check_loaded_page(page: Page, report: dict[str, Any], page_url: str) -> None:
    """Asserts everything the issue asks of a report page in a real browser."""
    errors = page.console_errors()
    assert errors == [], f"console errors: {errors}"
    # Self-contained: the page itself is the only thing the browser fetched.
    assert page.requests() == [page_url], page.requests()

    found = page.evaluate(_SERIES_JS)
    expected = expected_series(report)
    assert set(found) == set(expected), (sorted(found), sorted(expected))
    for plot_id, series in expected.items():
        assert found[plot_id]["series"] == series, (plot_id, found[plot_id], series)
        assert found[plot_id]["declared"] == len(series)
        assert found[plot_id]["titled"], f"{plot_id} has no accessible title"
        assert found[plot_id]["width"] > 300, f"{plot_id} is not laid out visibly"

    verdict = report["verdict"] or "none"
    assert page.evaluate("document.getElementById('verdict').dataset.verdict") == verdict
    assert page.evaluate("document.getElementById('verdict-word').textContent") == verdict
    if report["summary"]["threshold"] is not None:
        text = page.evaluate("document.getElementById('verdict-text').textContent")
        assert f"{report['summary']['threshold']:.3f}" in text
        assert f"{report['summary']['similarity']:.3f}" in text
    # Nothing a user string could have smuggled in.
    assert page.evaluate("document.querySelectorAll('script, iframe, img, object').length") == 0


def save_screenshot(page: Page, name: str, report: dict[str, Any] | None = None) -> None:
    """Keep a screenshot (and the report behind it) for a person to look at, when
    STITCHSIM_SCREENSHOT_DIR is set."""
    folder = os.environ.get("STITCHSIM_SCREENSHOT_DIR")
    if not folder:
        return
    path = Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path)
    if report is not None:
        path.with_suffix(".json").write_text(json.dumps(report, indent=2))
