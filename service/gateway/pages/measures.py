"""The similarity measures on the report page: per direction, a plot of the measures versus
depth (real inputs and IRIs, with the ceiling and the floor) beside agreement versus depth,
the sentence saying what a real-versus-IRI gap means, and the measure tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from stitchsim import catalogue, view
from stitchsim.models import Direction, Measure, MeasureRow, Report
from stitchsim.view import DIRECTION_LABEL, fmt, fmt_ci, fmt_signed
from stitchsim_service.gateway.pages.html import Col, esc, figure, table
from stitchsim_service.gateway.pages.plots import (
    FIG_WIDTH_IN,
    LEGEND_COLUMNS,
    Band,
    Plot,
    agreement_panel,
    band_legend,
    band_style,
    banded_controls,
    draw_band,
    render_svg,
    set_depth_axis,
)

MEASURES, INPUTS = catalogue.MEASURES, catalogue.MEASURE_INPUTS


def _at_points(rows: Sequence[MeasureRow], points: Sequence[tuple[str, str]]
               ) -> dict[tuple[str, str], list[MeasureRow]]:
    found: dict[tuple[str, str], list[MeasureRow]] = {p: [] for p in points}
    for r in rows:
        if (r.front_layer, r.back_layer) in found:
            found[(r.front_layer, r.back_layer)].append(r)
    return found


def measure_band(report: Report, control: str, direction: Direction, measure: Measure,
                 points: Sequence[tuple[str, str]]) -> Band | None:
    """The range a measure control reached at each stitch point, CI included, pooled over
    input kinds and sigmas (the floor differs a little between real inputs and IRIs)."""
    rows = [m for m in report.measure_controls
            if m.control == control and m.direction == direction and m.measure == measure]
    here = _at_points(rows, points)
    if not rows or any(not v for v in here.values()):
        return None
    lo = [min(min(r.ci[0], r.value) for r in here[p]) for p in points]
    hi = [max(max(r.ci[1], r.value) for r in here[p]) for p in points]
    return Band(lo, hi, band_style(control).label)


def _measure_panel(ax: Axes, report: Report, direction: Direction, measure: Measure,
                   points: Sequence[tuple[str, str]]) -> list[str]:
    series: list[str] = []
    tag = f"{direction}-{measure}"
    for control, band_look in banded_controls():
        band = measure_band(report, control, direction, measure, points)
        if band is not None:
            draw_band(ax, band, f"ref-measure-{control}-{tag}", band_look)
    for entry in INPUTS:
        kind, style = entry.name, entry.style.as_kwargs()
        rows = [m for m in report.measures
                if m.direction == direction and m.measure == measure and m.input == kind]
        by_point = {(r.front_layer, r.back_layer): r for r in rows}
        xs = [i for i, p in enumerate(points) if p in by_point]
        if not xs:
            continue
        chosen = [by_point[p] for p in points if p in by_point]
        lo, hi = [r.ci[0] for r in chosen], [r.ci[1] for r in chosen]
        band_xs = xs if len(xs) > 1 else [xs[0] - 0.12, xs[0] + 0.12]
        if len(xs) == 1:
            lo, hi = lo * 2, hi * 2
        ax.fill_between(band_xs, lo, hi, color=style["color"], alpha=0.2, linewidth=0,
                        zorder=2).set_gid(f"ci-measure-{tag}-{kind}")
        (line,) = ax.plot(xs, [r.value for r in chosen], zorder=3, **style)
        gid = f"series-measure-{tag}-{kind}"
        line.set_gid(gid)
        series.append(gid)
    ax.set_title(MEASURES.label(measure))
    ax.set_ylim(min(0.0, ax.get_ylim()[0]), 1.05)  # unbiased CKA may dip below 0
    return series


def _legend(report: Report) -> list[Any]:
    handles: list[Any] = [Line2D([], [], label=e.label, **e.style.as_kwargs()) for e in INPUTS]
    if report.unstitched_agreement:
        handles.append(Line2D([], [], label=catalogue.UNSTITCHED.label,
                              **catalogue.UNSTITCHED.style.as_kwargs()))
    return handles + [band_legend(style) for _, style in banded_controls()]


def measures_plot(report: Report, direction: Direction) -> Plot | None:
    measures = view.measures_of(report)
    points = view.stitch_points(report.results, direction)
    if not measures or not points:
        return None
    objective = view.objectives(report.results, direction)[0]
    plot_id = f"plot-measures-{direction}"
    series: list[str] = []

    def build() -> Figure:
        fig = Figure(figsize=(FIG_WIDTH_IN, 4.4), layout="constrained")
        axes = fig.subplots(1, 1 + len(measures), squeeze=False, sharey=True)[0]
        series.extend(agreement_panel(axes[0], report, direction, objective, points))
        axes[0].set_title(f"agreement, {catalogue.OBJECTIVES.label(objective)}")
        for ax, measure in zip(axes[1:], measures, strict=True):
            series.extend(_measure_panel(ax, report, direction, measure, points))
        endpoint = view.unstitched(report, direction) is not None
        for k, ax in enumerate(axes):
            # The endpoint is agreement's: the measures' panels have none.
            set_depth_axis(ax, points, direction, endpoint=endpoint and k == 0)
            ax.set_xlabel("")
        axes[0].set_ylabel("similarity, 0–1")
        fig.supxlabel("stitch point: from layer → into layer (shallow to deep)")
        fig.suptitle(f"Measures beside agreement, {view.direction_title(report, direction)}")
        handles = _legend(report)
        fig.legend(handles=handles, loc="outside lower center",
                   ncols=min(len(handles), LEGEND_COLUMNS), frameon=False)
        return fig

    title = f"Similarity measures and agreement versus depth, {DIRECTION_LABEL[direction]}"
    desc = _description(report, direction, measures)
    return Plot(plot_id, title, desc, render_svg(build, plot_id, title, desc), series)


def _description(report: Report, direction: Direction, measures: Sequence[Measure]) -> str:
    parts = [f"{view.direction_title(report, direction)}. Measures on real inputs and on "
             "IRIs at each stitch point, shallow to deep, beside agreement."]
    for measure in measures:
        for kind in INPUTS.names:
            values = [f"{view.measure_stitch_label(r)}: {r.value:.3f}" for r in report.measures
                      if r.direction == direction and r.measure == measure and r.input == kind]
            if values:
                parts.append(f"{MEASURES.label(measure)}, {INPUTS.label(kind)}: "
                             + "; ".join(values))
    return " ".join(parts)


def measures_section(report: Report, plots: Sequence[Plot]) -> str:
    if not report.measures:
        return ""
    figures = "".join(
        figure(p.plot_id, p.svg, len(p.series), esc(p.title) + ".") for p in plots
    )
    summary = table(
        [Col("direction"), Col("measure"), Col("real inputs", True), Col("IRIs", True),
         Col("gap", True)],
        [[DIRECTION_LABEL[m.direction], esc(MEASURES.label(m.measure)), fmt(m.real),
          fmt(m.iri), fmt_signed(m.gap)] for m in view.measure_summary(report)],
        "measures-summary-table",
    )
    rows = [
        [DIRECTION_LABEL[m.direction], esc(view.measure_stitch_label(m)),
         esc(MEASURES.label(m.measure)), f"{INPUTS.label(m.input)} ({m.split})",
         esc((m.control or "") + (f" σ {m.sigma:g}" if m.sigma is not None else "")),
         fmt(m.value), fmt_ci(m.ci), str(m.samples)]
        for m in view.ordered_measures(report.measures + report.measure_controls)
    ]
    every = table([Col("direction"), Col("stitch point"), Col("measure"), Col("input"),
                   Col("control"), Col("value", True), Col("CI", True), Col("samples", True)],
                  rows, "measures-table", wide=True)
    return (
        '<section id="measures"><h2>Similarity measures</h2>'
        f'<p id="measures-meaning">{esc(view.MEASURE_GAP_MEANING)}</p>'
        f'<p id="measures-sentence">{esc(view.measure_sentence(report))}</p>'
        f"{figures}{summary}<details><summary>Every measure row</summary>{every}</details>"
        "</section>"
    )
