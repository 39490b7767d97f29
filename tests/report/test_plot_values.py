"""The agreement plots of the report page draw the report's figures: every marker and line
vertex, read back from the SVG through the axis ticks a reader sees, sits at its row's
agreement, above the stitch point its x tick names. First on a hand-made report (both
directions, two objectives, two protocols, different layer names in front and back), then on
a real job's page fetched from the service."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from stitchsim_service.gateway.pages import render_report_page

from tests.report.sample import make_sample_report

SVG = "{http://www.w3.org/2000/svg}"
TOLERANCE = 1e-4  # the SVG gives coordinates to a millionth of a point
Drawn = dict[str, dict[tuple[str, str], float]]
"""series id -> {(layer the stitch reads from, layer it feeds into): agreement drawn}"""
ENDPOINT = ("no stitch", "(whole models)")
"""The endpoint's x tick (the unstitched models), as its two lines read."""


def agreement_svgs(page: str) -> dict[str, str]:
    """plot id -> its inline SVG, for the page's agreement plots."""
    pattern = r'<svg [^>]*aria-labelledby="(plot-agreement-[a-z_]+)-title.*?</svg>'
    return {m.group(1): m.group(0) for m in re.finditer(pattern, page, re.S)}


def _ticks(axes: ET.Element, kind: str) -> list[tuple[float, list[str]]]:
    """(pixel position, label lines) of each tick of the axes' x or y axis, in order."""
    out = []
    for group in axes.iter(f"{SVG}g"):
        if re.fullmatch(f"{kind}tick_[0-9]+", group.get("id", "")):
            mark = next(group.iter(f"{SVG}use"))
            texts = [t.text or "" for t in group.iter(f"{SVG}text")]
            out.append((float(mark.get(kind, "nan")), texts))
    return out


def _vertices(series: ET.Element) -> list[tuple[float, float]]:
    path = next(series.iter(f"{SVG}path")).get("d", "")
    numbers = [float(n) for n in re.findall(r"-?[0-9.]+(?:e-?[0-9]+)?", path)]
    return list(zip(numbers[0::2], numbers[1::2], strict=True))


def read_plot(svg: str) -> Drawn:
    """The agreement values the plot draws, by series and stitch point."""
    root = ET.fromstring(svg)
    panels = [g for g in root.iter(f"{SVG}g") if re.fullmatch(r"axes_[0-9]+", g.get("id", ""))]
    # Panels share their y axis: only the first of a row shows the tick labels.
    labels = next([float(t[0]) for _, t in ticks] for ticks in
                  (_ticks(p, "y") for p in panels) if ticks and all(t for _, t in ticks))
    drawn: Drawn = {}
    for panel in panels:
        yticks = _ticks(panel, "y")
        if not yticks:
            continue
        assert len(yticks) == len(labels)
        (p0, v0), (p1, v1) = (yticks[0][0], labels[0]), (yticks[-1][0], labels[-1])

        def value(pixel: float, p0: float = p0, v0: float = v0, p1: float = p1,
                  v1: float = v1) -> float:
            return v0 + (pixel - p0) * (v1 - v0) / (p1 - p0)

        # A linear axis: every labelled tick sits where the first and last put it.
        for (pixel, _), label in zip(yticks, labels, strict=True):
            assert abs(value(pixel) - label) < TOLERANCE
        # "i: source" over "→ target" under each stitch point; the endpoint's own tick last.
        points = {round(px, 3): (t[0].split(": ", 1)[1], t[1].removeprefix("→ "))
                  if ": " in t[0] else ENDPOINT for px, t in _ticks(panel, "x")}
        for series in panel.iter(f"{SVG}g"):
            gid = series.get("id", "")
            if gid.startswith("series-unstitched-"):
                (marker,) = [(float(u.get("x", "nan")), float(u.get("y", "nan")))
                             for u in series.iter(f"{SVG}use")]
                drawn[gid] = {points[round(marker[0], 3)]: value(marker[1])}
                continue
            if not gid.startswith("series-agreement-"):
                continue
            markers = [(float(u.get("x", "nan")), float(u.get("y", "nan")))
                       for u in series.iter(f"{SVG}use")]
            # The line runs through the markers, nowhere else.
            line = _vertices(series)
            assert len(line) == len(markers), gid
            assert all(abs(a - b) < TOLERANCE for v, m in zip(line, markers, strict=True)
                       for a, b in zip(v, m, strict=True)), gid
            drawn[gid] = {points[round(x, 3)]: value(y) for x, y in markers}
    return drawn


def expected(report: dict[str, Any], direction: str) -> Drawn:
    out: Drawn = {}
    for row in report["results"]:
        if row["direction"] != direction:
            continue
        pair = (row["front_layer"], row["back_layer"])
        point = pair if direction == "front_to_back" else pair[::-1]
        gid = f"series-agreement-{direction}-{row['objective']}-{row['protocol']}"
        out.setdefault(gid, {})[point] = row["agreement"]
    # Every panel (one per objective) ends in the unstitched models' agreement.
    for end in report.get("unstitched_agreement", []):
        if end["direction"] != direction:
            continue
        for objective in {row["objective"] for row in report["results"]
                          if row["direction"] == direction}:
            out[f"series-unstitched-{direction}-{objective}"] = {ENDPOINT: end["agreement"]}
    return out


def assert_drawn_as_reported(page: str, report: dict[str, Any]) -> None:
    svgs = agreement_svgs(page)
    directions = {row["direction"] for row in report["results"]}
    assert set(svgs) == {f"plot-agreement-{d}" for d in directions}
    for direction in directions:
        drawn = read_plot(svgs[f"plot-agreement-{direction}"])
        want = expected(report, direction)
        assert set(drawn) == set(want)
        for gid, points in want.items():
            assert set(drawn[gid]) == set(points), gid
            for point, agreement in points.items():
                assert drawn[gid][point] == pytest.approx(agreement, abs=TOLERANCE), (
                    gid, point)


def test_sample_report_plots_draw_its_figures() -> None:
    report = make_sample_report(front_layers=("act1", "layer1", "layer2"),
                                back_layers=("layer1", "layer2", "layer3"))
    data = report.model_dump(mode="json")
    # Two objectives, both protocols, both directions: panels side by side share an axis.
    assert len({(r["objective"], r["protocol"], r["direction"]) for r in data["results"]}) == 8
    page = render_report_page(report)
    assert_drawn_as_reported(page, data)
    # The endpoint is drawn in every panel (two objectives, two directions), at its own
    # value, and named in the legend, the plot's description and its table.
    drawn = {gid: v for d in ("front_to_back", "back_to_front")
             for gid, v in read_plot(agreement_svgs(page)[f"plot-agreement-{d}"]).items()
             if gid.startswith("series-unstitched-")}
    assert len(drawn) == 4
    assert drawn["series-unstitched-back_to_front-fula"][ENDPOINT] == pytest.approx(
        0.5187, abs=TOLERANCE)
    assert "no stitch (whole models)" in page and "Endpoint, no stitch" in page
    assert 'id="unstitched-table"' in page


def test_real_job_page_plots_draw_its_figures(live_service: Any,
                                             real_job: tuple[str, dict[str, Any]]) -> None:
    job_id, report = real_job
    with live_service.client() as http:
        page = http.get(f"/jobs/{job_id}/report.html")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert_drawn_as_reported(page.text, report)
    assert {u["direction"] for u in report["unstitched_agreement"]} == {
        r["direction"] for r in report["results"]}
    # Not a page of constants: the figures drawn differ between the protocols.
    assert len({round(r["agreement"], 4) for r in report["results"]}) > 1

