"""The plots of the report page, as inline SVG: agreement versus depth per direction (both
protocols on shared axes, controls as bands) and IRI convergence per stitch point.

Matplotlib escapes what it writes into the SVG itself; math-text parsing is switched off so a
`$` in a layer name is shown as typed instead of being interpreted. Figures are plain Figure
objects (no pyplot: no global registry, no GUI backend).
"""

from __future__ import annotations

import io
import math
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib
from matplotlib.axes import Axes
from matplotlib.colors import to_hex, to_rgb, to_rgba
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
from stitchsim import catalogue, view
from stitchsim.catalogue import BLACK, GREY, ORANGE, PURPLE, VERMILLION, BandStyle
from stitchsim.models import Control, Direction, Objective, Report, ResultRow
from stitchsim.view import DIRECTION_LABEL, stitch_order
from stitchsim_service.gateway.pages.html import esc

# Series are drawn in the catalogue's styles (Okabe & Ito's colour-blind-safe palette, each
# series with its own line style and marker, so the plots survive greyscale printing).
IRI_STATS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("start_median", "median at start",
     {"color": GREY, "linestyle": "-.", "marker": "o", "markerfacecolor": "white"}),
    ("median", "median", {"color": VERMILLION, "linestyle": "-", "marker": "s"}),
    ("p90", "90th percentile", {"color": ORANGE, "linestyle": "--", "marker": "D"}),
    ("max", "maximum", {"color": PURPLE, "linestyle": ":", "marker": "^"}),
)

MAX_TICK_CHARS = 18
"""Layer names longer than this are shortened on plot axes (the tables keep them whole)."""

MAX_TICKS = 8
"""At most this many stitch points are labelled on one axis; more would overlap."""

LEGEND_COLUMNS = 4
"""Legend entries a row under a figure: more would run past its width."""

FIG_WIDTH_IN = 9.8
"""Every figure has this width, so text comes out the same size in all of them (the page
shows SVGs at their natural size, shrinking only to fit narrow screens)."""

# Matplotlib's rcParams are process-global and the gateway renders in a thread pool: one lock
# keeps one render's settings from leaking into another's figure.
_RENDER_LOCK = threading.Lock()
_RC: dict[str, Any] = {
    "svg.fonttype": "none",  # real <text>: selectable, searchable, read by screen readers
    "text.parse_math": False,  # user strings with "$" must not turn into math text
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#DDDDDD",
    "grid.linewidth": 0.6,
    "lines.linewidth": 1.8,
    "lines.markersize": 5,
}


def _short(name: str, limit: int = MAX_TICK_CHARS) -> str:
    # Cut in the middle: the head says which block, the tail which sub-module.
    if len(name) <= limit:
        return name
    keep = limit - 1
    return name[: (keep + 1) // 2] + "…" + name[len(name) - keep // 2 :]




@dataclass
class Plot:
    plot_id: str
    title: str
    description: str
    svg: str
    series: list[str]


def render_svg(build: Callable[[], Figure], plot_id: str, title: str, description: str) -> str:
    # The salt makes matplotlib's internal ids (clip paths, markers) unique per plot, so
    # several SVGs can share one HTML document, and deterministic from run to run.
    with _RENDER_LOCK, matplotlib.rc_context({**_RC, "svg.hashsalt": plot_id}):
        # A plain Figure, not pyplot: no global figure registry, no GUI backend to pick.
        fig = build()
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return _inline_svg(buf.getvalue(), plot_id, title, description)


def _inline_svg(svg: str, plot_id: str, title: str, description: str) -> str:
    """Make a standalone SVG document fit for inlining into HTML, with an accessible name."""
    svg = svg[svg.index("<svg") :]  # XML prolog and DOCTYPE are not allowed inside HTML
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, count=1, flags=re.S)
    open_end = svg.index(">") + 1
    opening = svg[:open_end].replace(
        "<svg ", f'<svg role="img" aria-labelledby="{plot_id}-title {plot_id}-desc" ', 1
    )
    a11y = (
        f'<title id="{plot_id}-title">{esc(title)}</title>'
        f'<desc id="{plot_id}-desc">{esc(description)}</desc>'
    )
    return opening + a11y + svg[open_end:]


ENDPOINT_TICK = "no stitch\n(whole models)"
"""The x tick of the agreement panels' endpoint, one slot past the deepest stitch point."""


def set_depth_axis(ax: Axes, points: Sequence[tuple[str, str]], direction: Direction,
                   endpoint: bool = False) -> None:
    """Stitch points shallow to deep; with `endpoint`, one more slot for the unstitched
    models (the paper's plots end in it)."""
    step = max(1, math.ceil(len(points) / MAX_TICKS))
    ticks = list(range(0, len(points), step))
    labels = []
    for i in ticks:
        source, target = stitch_order(*points[i], direction)
        labels.append(f"{i}: {_short(source)}\n→ {_short(target)}")
    if endpoint:
        ticks.append(len(points))
        labels.append(ENDPOINT_TICK)
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels)
    ax.set_xlim(-0.5, len(points) - 0.5 + (1 if endpoint else 0))
    ax.set_xlabel("stitch point: from layer → into layer (shallow to deep)")


def draw_endpoint(ax: Axes, report: Report, direction: Direction, n_points: int,
                  tag: str) -> str | None:
    """The unstitched models' agreement at the deep end: a marker with its interval one slot
    past the deepest point, and a dotted line across the panel at its height (the catalogue's
    style). Returns the marker's id."""
    found = view.unstitched(report, direction)
    if found is None:
        return None
    style = catalogue.UNSTITCHED.style.as_kwargs()
    ref = ax.axhline(found.agreement, color=style["color"], linestyle=style["linestyle"],
                     linewidth=1.0, alpha=0.7, zorder=2)
    ref.set_gid(f"ref-unstitched-{tag}")
    lo, hi = found.agreement_ci
    ax.errorbar([n_points], [found.agreement],
                yerr=[[max(0.0, found.agreement - lo)], [max(0.0, hi - found.agreement)]],
                color=style["color"], linewidth=1.0, capsize=3, zorder=3).lines[2][0].set_gid(
                    f"ci-unstitched-{tag}")
    (marker,) = ax.plot([n_points], [found.agreement], color=style["color"],
                        marker=style["marker"], markersize=8, linestyle="none", zorder=4)
    gid = f"series-unstitched-{tag}"
    marker.set_gid(gid)
    return gid


@dataclass
class Band:
    lo: list[float]
    hi: list[float]
    label: str


def control_band(
    controls: Sequence[ResultRow],
    kind: Control,
    direction: Direction,
    objective: Objective,
    points: Sequence[tuple[str, str]],
) -> Band | None:
    """The range a control reached at each stitch point, CI included, over all its settings.

    A control belongs to the layer the stitch feeds into (identity stitches g into itself
    there, clustered noise is fed through T into the rest of g). Rows are matched to the
    plotted points by direction, objective and layer pair, then by that receiving layer
    alone, each falling back to "any" when the engine reported the control more coarsely, so
    a band is drawn whenever the control ran. Protocols are pooled: the band spans them.
    """
    rows = [c for c in controls if c.control == kind]
    rows = [c for c in rows if c.direction == direction] or rows
    rows = [c for c in rows if c.objective == objective] or rows
    if not rows:
        return None
    lo: list[float] = []
    hi: list[float] = []
    for pair in points:
        target = stitch_order(*pair, direction)[1]
        here = (
            [c for c in rows if (c.front_layer, c.back_layer) == pair]
            or [c for c in rows if stitch_order(c.front_layer, c.back_layer, c.direction)[1]
                == target]
            or rows
        )
        lo.append(min(min(c.agreement_ci[0], c.agreement) for c in here))
        hi.append(max(max(c.agreement_ci[1], c.agreement) for c in here))
    label = band_style(kind).label
    sigmas = sorted({c.sigma for c in rows if c.sigma is not None})
    if sigmas:
        label += " (σ " + ", ".join(f"{s:g}" for s in sigmas) + ")"
    return Band(lo, hi, label)


def banded_controls() -> list[tuple[Control, BandStyle]]:
    """The controls drawn as bands (a ceiling, a floor), in catalogue order."""
    return [(c.name, c.band) for c in catalogue.CONTROLS if c.band is not None]


def band_style(control: str) -> BandStyle:
    entry = catalogue.CONTROLS.get(control)
    if entry is None or entry.band is None:
        return BandStyle(GREY, control)
    return entry.band


def band_legend(style: BandStyle) -> Patch:
    if not style.hatch:
        return Patch(facecolor=to_rgba(style.color, 0.3), label=style.label)
    # Opaque stand-ins for the translucent band: see draw_band on SVG hatch fading.
    return Patch(facecolor=_over_white(style.color, 0.15),
                 edgecolor=_over_white(style.color, 0.6), linewidth=0, hatch=style.hatch,
                 label=style.label)


def _over_white(color: str, alpha: float) -> str:
    rgb = to_rgb(color)
    return to_hex(tuple(alpha * c + (1 - alpha) for c in rgb))


def draw_band(ax: Axes, band: Band, gid: str, style: BandStyle) -> None:
    color, hatch = style.color, style.hatch
    # Each stitch point owns the x range i ± 0.5, so the band steps from point to point.
    xs = [x for i in range(len(band.lo)) for x in (i - 0.5, i + 0.5)]
    lo = [v for v in band.lo for _ in (0, 1)]
    hi = [v for v in band.hi for _ in (0, 1)]
    # Outlined when unhatched: the identity band is often a sliver just under 1.
    face = ax.fill_between(xs, lo, hi, facecolor=to_rgba(color, 0.2),
                           edgecolor=to_rgba(color, 0.0 if hatch else 0.8),
                           linewidth=0.0 if hatch else 0.8, zorder=1)
    face.set_gid(gid)
    if hatch:
        # The hatching goes on a second, transparent-faced layer: in SVG a translucent face
        # fades its hatch pattern with it, and the hatch is what tells the bands apart
        # without colour.
        lines = ax.fill_between(xs, lo, hi, facecolor="none", edgecolor=to_rgba(color, 0.6),
                                linewidth=0.0, hatch=hatch, zorder=1)
        lines.set_gid(f"{gid}-hatch")


def agreement_panel(
    ax: Axes,
    report: Report,
    direction: Direction,
    objective: Objective,
    points: Sequence[tuple[str, str]],
) -> list[str]:
    """One objective: both protocols on shared axes, so the drop reads as a vertical gap."""
    series: list[str] = []
    tag = f"{direction}-{objective}"
    for kind, style in banded_controls():
        band = control_band(report.controls, kind, direction, objective, points)
        if band is not None:
            draw_band(ax, band, f"ref-{kind}-{tag}", style)
    for protocol in view.protocols(report.results):
        by_point = {
            (r.front_layer, r.back_layer): r
            for r in report.results
            if r.direction == direction and r.objective == objective and r.protocol == protocol
        }
        if not by_point:
            continue
        xs = [i for i, p in enumerate(points) if p in by_point]
        rows = [by_point[p] for p in points if p in by_point]
        style = protocol_style(protocol)
        lo, hi = [r.agreement_ci[0] for r in rows], [r.agreement_ci[1] for r in rows]
        band_xs = xs
        if len(xs) == 1:
            # A band over one x has no width: give a lone point a short box instead.
            band_xs, lo, hi = [xs[0] - 0.12, xs[0] + 0.12], lo * 2, hi * 2
        band = ax.fill_between(band_xs, lo, hi, color=style["color"], alpha=0.2, linewidth=0,
                               zorder=2)
        band.set_gid(f"ci-{tag}-{protocol}")
        (line,) = ax.plot(xs, [r.agreement for r in rows], zorder=3, **style)
        gid = f"series-agreement-{tag}-{protocol}"
        line.set_gid(gid)
        series.append(gid)
    endpoint = draw_endpoint(ax, report, direction, len(points), tag)
    if endpoint is not None:
        series.append(endpoint)
    title = catalogue.OBJECTIVES.label(objective)
    drop = view.mean_drop(report, direction, objective)
    if drop is not None:
        title += f"\nmean drop {view.fmt_signed(drop)}"
    ax.set_title(title)
    ax.set_ylim(0, 1.05)
    return series


def _legend_handles(report: Report) -> list[Any]:
    handles: list[Any] = [
        Line2D([], [], label=catalogue.PROTOCOLS.label(p), **protocol_style(p))
        for p in view.protocols(report.results)
    ]
    if report.unstitched_agreement:
        handles.append(Line2D([], [], label=catalogue.UNSTITCHED.label,
                              **catalogue.UNSTITCHED.style.as_kwargs()))
    handles.append(Patch(facecolor=to_rgba(GREY, 0.35), label="confidence interval"))
    kinds = {c.control for c in report.controls}
    handles += [band_legend(style) for kind, style in banded_controls() if kind in kinds]
    return handles


def protocol_style(protocol: str) -> dict[str, str]:
    entry = catalogue.PROTOCOLS.get(protocol)
    return (entry.style if entry else catalogue.PlotStyle(GREY)).as_kwargs()


def agreement_plot(report: Report, direction: Direction) -> Plot:
    points = view.stitch_points(report.results, direction)
    objectives = view.objectives(report.results, direction)
    plot_id = f"plot-agreement-{direction}"
    series: list[str] = []

    def build() -> Figure:
        cols = min(len(objectives), 2)
        nrows = math.ceil(len(objectives) / cols)
        fig = Figure(figsize=(FIG_WIDTH_IN, 3.5 * nrows + 0.9), layout="constrained")
        axes = fig.subplots(nrows, cols, squeeze=False, sharey=True)
        for k, objective in enumerate(objectives):
            ax = axes[k // cols][k % cols]
            series.extend(agreement_panel(ax, report, direction, objective, points))
            set_depth_axis(ax, points, direction,
                           endpoint=view.unstitched(report, direction) is not None)
            if k % cols == 0:
                ax.set_ylabel(f"{view.agreement_name(report)} with "
                              f"{view.end_model(report, direction)}, 0–1")
        for k in range(len(objectives), nrows * cols):
            axes[k // cols][k % cols].set_visible(False)
        fig.suptitle(view.direction_title(report, direction))
        handles = _legend_handles(report)
        fig.legend(handles=handles, loc="outside lower center",
                   ncols=min(len(handles), LEGEND_COLUMNS), frameon=False)
        return fig

    title = f"Agreement versus depth, {DIRECTION_LABEL[direction]}"
    desc = _agreement_description(report, direction, objectives, len(points))
    svg = render_svg(build, plot_id, title, desc)
    return Plot(plot_id, title, desc, svg, series)


def _agreement_description(
    report: Report, direction: Direction, objectives: Sequence[Objective], n_points: int
) -> str:
    """The plot's data in words, for screen readers."""
    parts = [
        f"{view.direction_title(report, direction)}. Agreement of the stitched model with "
        f"{view.end_model(report, direction)} at {n_points} stitch points, shallow to deep, with "
        "confidence bands."
    ]
    found = view.unstitched(report, direction)
    if found is not None:
        parts.append(f"Endpoint, {catalogue.UNSTITCHED.label}: {found.agreement:.3f} "
                     f"{view.fmt_ci(found.agreement_ci)}.")
    for objective in objectives:
        for protocol in view.protocols(report.results):
            values = [
                f"{view.stitch_label(r)}: {r.agreement:.3f}"
                for r in report.results
                if r.direction == direction and r.objective == objective
                and r.protocol == protocol
            ]
            if values:
                parts.append(f"{objective}, {catalogue.PROTOCOLS.label(protocol)}: "
                             + "; ".join(values))
    return " ".join(parts)


def _log_axis(ax: Axes) -> None:
    # Plain decimals: the default log labels are math text, which is switched off here.
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def iri_plot(report: Report, direction: Direction) -> Plot | None:
    rows = view.iri_rows(report, direction)
    if not rows:
        return None
    plot_id = f"plot-iri-{direction}"
    points = [(r.front_layer, r.back_layer) for r in rows]
    threshold = report.spec.iri.converged_below
    series: list[str] = []

    def build() -> Figure:
        fig = Figure(figsize=(FIG_WIDTH_IN, 3.9), layout="constrained")
        ax = fig.subplots()
        values: list[float] = [threshold]
        for stat, label, style in IRI_STATS:
            ys = [float(getattr(r.iri, stat)) for r in rows]
            values += ys
            (line,) = ax.plot(range(len(rows)), ys, label=label, **style)
            gid = f"series-iri-{direction}-{stat}"
            line.set_gid(gid)
            series.append(gid)
        ref = ax.axhline(threshold, color=BLACK, linewidth=1.0, linestyle=(0, (6, 3)),
                         label=f"converged below {threshold:g}")
        ref.set_gid(f"ref-iri-threshold-{direction}")
        if min(values) > 0 and max(values) / min(values) > 20:
            # Converging IRIs shrink the distance by orders of magnitude.
            _log_axis(ax)
        else:
            ax.set_ylim(0, max(values) * 1.08)
        set_depth_axis(ax, points, direction)
        ax.set_ylabel("relative distance at the stitch point\n‖f(x′) − f(x)‖ / ‖f(x)‖")
        front = view.model_names(report)[0 if direction == "front_to_back" else 1]
        ax.set_title(f"IRI convergence, {DIRECTION_LABEL[direction]}: IRIs for {front}")
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
        return fig

    title = f"IRI convergence per stitch point, {DIRECTION_LABEL[direction]}"
    desc = (
        "Relative distance between the front model's representation of each IRI and of its "
        f"source image, per stitch point; converged when the median is below {threshold:g}. "
        + "; ".join(
            f"{stitch_order(r.front_layer, r.back_layer, direction)[0]}: median "
            f"{r.iri.median:.3g} (start {r.iri.start_median:.3g}"
            + (f", {r.iri.steps_used:.0f} of {r.iri.steps} steps" if r.iri.steps_used else "")
            + ")"
            for r in rows
            if r.iri is not None
        )
    )
    svg = render_svg(build, plot_id, title, desc)
    return Plot(plot_id, title, desc, svg, series)
