"""Human-readable pages of a job: the finished report with plots, and a self-refreshing
progress page while the job runs.

The gateway has no torch, so this module needs only the contract models, the standard library
and matplotlib. Every page is self-contained (inline CSS and inline SVG, no script, no external
asset) and carries a Content-Security-Policy that forbids loading anything, so it works offline
and an injected string could not pull anything in even if escaping failed somewhere.

Every string that comes from a user (architecture, layer and dataset names, checkpoint ids,
warnings, error messages) goes through `_esc` before it reaches the HTML. Matplotlib escapes
what it writes into the SVG itself; math-text parsing is switched off so a `$` in a layer name
is shown as typed instead of being interpreted.

Entry points: `render_report_page(report)`, `render_progress_page(job)`, and
`render_job_page(job, report)` which picks one of the two for `GET /jobs/{id}/report.html`.
"""

from __future__ import annotations

import io
import json
import math
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from html import escape
from typing import Any

import matplotlib
from matplotlib.axes import Axes
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
from stitchsim.models import (
    Control,
    Direction,
    JobStatus,
    Objective,
    Protocol,
    Report,
    ResultRow,
)
from stitchsim.table import fmt as _num
from stitchsim.table import fmt_signed as _signed

# Okabe & Ito's palette: distinguishable with every common form of colour blindness. Each
# series also differs in line style and marker, so the plots survive greyscale printing.
BLUE = "#0072B2"
VERMILLION = "#D55E00"
GREEN = "#009E73"
ORANGE = "#E69F00"
PURPLE = "#CC79A7"
GREY = "#6E6E6E"
BLACK = "#000000"

PROTOCOL_STYLE: dict[str, dict[str, Any]] = {
    "standard": {"color": BLUE, "linestyle": "-", "marker": "o"},
    "invariance_aware": {"color": VERMILLION, "linestyle": "--", "marker": "s"},
}
PROTOCOL_LABEL: dict[str, str] = {
    "standard": "standard",
    "invariance_aware": "invariance-aware",
}
DIRECTION_LABEL: dict[str, str] = {
    "front_to_back": "front → back",
    "back_to_front": "back → front",
}
OBJECTIVE_LABEL: dict[str, str] = {
    "hlm": "hard-label matching (hlm)",
    "slm": "soft-label matching (slm)",
    "dm": "direct matching (dm)",
    "fula": "functional latent alignment (fula)",
}
CONTROL_LABEL: dict[str, str] = {
    "identity": "identity",
    "clustered_noise": "clustered noise",
    "shortcut": "pixel shortcut",
}
IRI_STATS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("start_median", "median at start",
     {"color": GREY, "linestyle": "-.", "marker": "o", "markerfacecolor": "white"}),
    ("median", "median", {"color": VERMILLION, "linestyle": "-", "marker": "s"}),
    ("p90", "90th percentile", {"color": ORANGE, "linestyle": "--", "marker": "D"}),
    ("max", "maximum", {"color": PURPLE, "linestyle": ":", "marker": "^"}),
)

REFRESH_SECONDS = 5
"""How often the progress page reloads itself while the job is queued or running."""

MAX_TICK_CHARS = 18
"""Layer names longer than this are shortened on plot axes (the tables keep them whole)."""

MAX_TICKS = 8
"""At most this many stitch points are labelled on one axis; more would overlap."""

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


def _esc(value: object) -> str:
    return escape(str(value), quote=True)


def _ci(ci: Sequence[float] | None, digits: int = 3) -> str:
    if not ci:
        return ""
    return f"[{_num(ci[0], digits)}, {_num(ci[1], digits)}]"


def _short(name: str, limit: int = MAX_TICK_CHARS) -> str:
    # Cut in the middle: the head says which block, the tail which sub-module.
    if len(name) <= limit:
        return name
    keep = limit - 1
    return name[: (keep + 1) // 2] + "…" + name[len(name) - keep // 2 :]


# ------------------------------------------------------------------ what the report holds


def _directions(report: Report) -> list[Direction]:
    present = {r.direction for r in report.results}
    return [d for d in ("front_to_back", "back_to_front") if d in present]


def _present_protocols(rows: Iterable[ResultRow]) -> list[Protocol]:
    seen = {r.protocol for r in rows}
    return [p for p in ("standard", "invariance_aware") if p in seen]


def _present_objectives(rows: Iterable[ResultRow], direction: Direction) -> list[Objective]:
    seen = {r.objective for r in rows if r.direction == direction}
    return [o for o in ("hlm", "slm", "dm", "fula") if o in seen]


def _stitch_points(rows: Iterable[ResultRow], direction: Direction) -> list[tuple[str, str]]:
    """The spec's layer pairs (front model's layer, back model's layer) of one direction, in
    the order the engine reports them: the depth order."""
    pairs = ((r.front_layer, r.back_layer) for r in rows if r.direction == direction)
    return list(dict.fromkeys(pairs))


def stitch_order(front_layer: str, back_layer: str, direction: Direction) -> tuple[str, str]:
    """(layer the stitch reads from, layer it feeds into). Rows name layers by model (the
    spec's front and back), so back → front stitches the back model's layer into the front
    model's."""
    if direction == "front_to_back":
        return front_layer, back_layer
    return back_layer, front_layer


def _stitch_label(row: ResultRow) -> str:
    source, target = stitch_order(row.front_layer, row.back_layer, row.direction)
    return f"{source} → {target}"


def _count_points(report: Report) -> int:
    return max((len(_stitch_points(report.results, d)) for d in _directions(report)), default=0)


def _model_names(report: Report) -> tuple[str, str]:
    front, back = report.front.arch, report.back.arch
    if front == back:
        return f"{front} (front)", f"{back} (back)"
    return front, back


def _end_model(report: Report, direction: Direction) -> str:
    return _model_names(report)[1 if direction == "front_to_back" else 0]


def direction_title(report: Report, direction: Direction) -> str:
    front, back = _model_names(report)
    first, second = (front, back) if direction == "front_to_back" else (back, front)
    return f"{DIRECTION_LABEL[direction]}: {first} up to the stitch, then {second}"


def iri_rows(report: Report, direction: Direction) -> list[ResultRow]:
    """One row per source layer: IRIs depend only on the model in front position and the
    layer the stitch reads from."""
    seen: dict[str, ResultRow] = {}
    for r in report.results:
        if r.direction == direction and r.iri is not None:
            seen.setdefault(stitch_order(r.front_layer, r.back_layer, direction)[0], r)
    return list(seen.values())


# ------------------------------------------------------------------ figures → inline SVG


@dataclass
class Plot:
    plot_id: str
    title: str
    description: str
    svg: str
    series: list[str]


def _render_svg(build: Callable[[], Figure], plot_id: str, title: str, description: str) -> str:
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
        f'<title id="{plot_id}-title">{_esc(title)}</title>'
        f'<desc id="{plot_id}-desc">{_esc(description)}</desc>'
    )
    return opening + a11y + svg[open_end:]


def _set_depth_axis(ax: Axes, points: Sequence[tuple[str, str]], direction: Direction) -> None:
    step = max(1, math.ceil(len(points) / MAX_TICKS))
    ticks = list(range(0, len(points), step))
    labels = []
    for i in ticks:
        source, target = stitch_order(*points[i], direction)
        labels.append(f"{i}: {_short(source)}\n→ {_short(target)}")
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels)
    ax.set_xlim(-0.5, len(points) - 0.5)
    ax.set_xlabel("stitch point: from layer → into layer (shallow to deep)")


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
    label = "identity ceiling" if kind == "identity" else "clustered-noise floor"
    sigmas = sorted({c.sigma for c in rows if c.sigma is not None})
    if sigmas:
        label += " (σ " + ", ".join(f"{s:g}" for s in sigmas) + ")"
    return Band(lo, hi, label)


def _draw_band(ax: Axes, band: Band, gid: str, color: str, hatch: str | None) -> None:
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


def _agreement_panel(
    ax: Axes,
    report: Report,
    direction: Direction,
    objective: Objective,
    points: Sequence[tuple[str, str]],
) -> list[str]:
    """One objective: both protocols on shared axes, so the drop reads as a vertical gap."""
    series: list[str] = []
    tag = f"{direction}-{objective}"
    for kind, color, hatch in (("clustered_noise", GREY, "///"), ("identity", GREEN, None)):
        band = control_band(report.controls, kind, direction, objective, points)
        if band is not None:
            _draw_band(ax, band, f"ref-{kind}-{tag}", color, hatch)
    means: dict[str, float] = {}
    for protocol in _present_protocols(report.results):
        by_point = {
            (r.front_layer, r.back_layer): r
            for r in report.results
            if r.direction == direction and r.objective == objective and r.protocol == protocol
        }
        if not by_point:
            continue
        xs = [i for i, p in enumerate(points) if p in by_point]
        rows = [by_point[p] for p in points if p in by_point]
        style = PROTOCOL_STYLE[protocol]
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
        means[protocol] = sum(r.agreement for r in rows) / len(rows)
    title = OBJECTIVE_LABEL[objective]
    if "standard" in means and "invariance_aware" in means:
        title += f"\nmean drop {means['standard'] - means['invariance_aware']:+.3f}"
    ax.set_title(title)
    ax.set_ylim(0, 1.05)
    return series


def _legend_handles(report: Report) -> list[Any]:
    handles: list[Any] = [
        Line2D([], [], label=PROTOCOL_LABEL[p], **PROTOCOL_STYLE[p])
        for p in _present_protocols(report.results)
    ]
    handles.append(Patch(facecolor=to_rgba(GREY, 0.35), label="confidence interval"))
    kinds = {c.control for c in report.controls}
    if "identity" in kinds:
        handles.append(Patch(facecolor=to_rgba(GREEN, 0.3), label="identity ceiling"))
    if "clustered_noise" in kinds:
        # Opaque stand-ins for the translucent band: see _draw_band on SVG hatch fading.
        handles.append(Patch(facecolor="#EAEAEA", edgecolor="#A8A8A8", linewidth=0,
                             hatch="///", label="clustered-noise floor"))
    return handles


def agreement_plot(report: Report, direction: Direction) -> Plot:
    points = _stitch_points(report.results, direction)
    objectives = _present_objectives(report.results, direction)
    plot_id = f"plot-agreement-{direction}"
    series: list[str] = []

    def build() -> Figure:
        cols = min(len(objectives), 2)
        nrows = math.ceil(len(objectives) / cols)
        fig = Figure(figsize=(FIG_WIDTH_IN, 3.5 * nrows + 0.9), layout="constrained")
        axes = fig.subplots(nrows, cols, squeeze=False, sharey=True)
        for k, objective in enumerate(objectives):
            ax = axes[k // cols][k % cols]
            series.extend(_agreement_panel(ax, report, direction, objective, points))
            _set_depth_axis(ax, points, direction)
            if k % cols == 0:
                ax.set_ylabel(f"agreement with {_end_model(report, direction)}, 0–1")
        for k in range(len(objectives), nrows * cols):
            axes[k // cols][k % cols].set_visible(False)
        fig.suptitle(direction_title(report, direction))
        handles = _legend_handles(report)
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles),
                   frameon=False)
        return fig

    title = f"Agreement versus depth, {DIRECTION_LABEL[direction]}"
    desc = _agreement_description(report, direction, objectives, len(points))
    svg = _render_svg(build, plot_id, title, desc)
    return Plot(plot_id, title, desc, svg, series)


def _agreement_description(
    report: Report, direction: Direction, objectives: Sequence[Objective], n_points: int
) -> str:
    """The plot's data in words, for screen readers."""
    parts = [
        f"{direction_title(report, direction)}. Agreement of the stitched model with "
        f"{_end_model(report, direction)} at {n_points} stitch points, shallow to deep, with "
        "confidence bands."
    ]
    for objective in objectives:
        for protocol in _present_protocols(report.results):
            values = [
                f"{_stitch_label(r)}: {r.agreement:.3f}"
                for r in report.results
                if r.direction == direction and r.objective == objective
                and r.protocol == protocol
            ]
            if values:
                parts.append(f"{objective}, {PROTOCOL_LABEL[protocol]}: " + "; ".join(values))
    return " ".join(parts)


def _log_axis(ax: Axes) -> None:
    # Plain decimals: the default log labels are math text, which is switched off here.
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def iri_plot(report: Report, direction: Direction) -> Plot | None:
    rows = iri_rows(report, direction)
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
        _set_depth_axis(ax, points, direction)
        ax.set_ylabel("relative distance at the stitch point\n‖f(x′) − f(x)‖ / ‖f(x)‖")
        front = _model_names(report)[0 if direction == "front_to_back" else 1]
        ax.set_title(f"IRI convergence, {DIRECTION_LABEL[direction]}: IRIs for {front}")
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
        return fig

    title = f"IRI convergence per stitch point, {DIRECTION_LABEL[direction]}"
    desc = (
        "Relative distance between the front model's representation of each IRI and of its "
        f"source image, per stitch point; converged when the median is below {threshold:g}. "
        + "; ".join(
            f"{stitch_order(r.front_layer, r.back_layer, direction)[0]}: median "
            f"{r.iri.median:.3g} (start {r.iri.start_median:.3g})"
            for r in rows
            if r.iri is not None
        )
    )
    svg = _render_svg(build, plot_id, title, desc)
    return Plot(plot_id, title, desc, svg, series)


# ------------------------------------------------------------------ HTML building blocks

_CSS = """
:root { color-scheme: light; --ink: #1a1a1a; --muted: #555; --line: #d0d0d0;
  --ok: #00664a; --bad: #a33a00; --none: #444; }
* { box-sizing: border-box; }
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", Arial, sans-serif;
  color: var(--ink); background: #fff; margin: 0; }
main { max-width: 1100px; margin: 0 auto; padding: 1.2rem 1.4rem 3rem; }
h1 { font-size: 1.6rem; margin: 0.2rem 0 0.1rem; }
h2 { font-size: 1.25rem; margin: 2rem 0 0.5rem; border-bottom: 1px solid var(--line);
  padding-bottom: 0.2rem; }
h3 { font-size: 1.05rem; margin: 1.2rem 0 0.4rem; }
.sub { color: var(--muted); margin: 0; overflow-wrap: anywhere; }
.kw { color: var(--muted); }
code, .mono { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 0.88em;
  overflow-wrap: anywhere; }
table { border-collapse: collapse; margin: 0.4rem 0 0.8rem; font-size: 0.92rem; }
th, td { border-bottom: 1px solid var(--line); padding: 0.25rem 0.6rem; text-align: left;
  vertical-align: top; }
th { background: #f4f4f4; font-weight: 600; }
td code { overflow-wrap: normal; white-space: nowrap; }
table.wide { font-size: 0.85rem; }
table.wide td, table.wide th { white-space: nowrap; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.scroll { overflow-x: auto; }
.verdict { border: 2px solid var(--none); border-left-width: 10px; border-radius: 6px;
  padding: 0.8rem 1.1rem; margin: 1rem 0; background: #f7f7f7; }
.verdict.similar { border-color: var(--ok); background: #eef8f4; }
.verdict.dissimilar { border-color: var(--bad); background: #fcf1eb; }
.verdict .word { font-size: 1.5rem; font-weight: 700; text-transform: uppercase;
  letter-spacing: 0.03em; }
.verdict.similar .word { color: var(--ok); }
.verdict.dissimilar .word { color: var(--bad); }
.verdict p { margin: 0.3rem 0; }
.warnings { border: 1px solid #e0b000; background: #fff9e0; border-radius: 6px;
  padding: 0.5rem 1rem; }
.warnings li { margin: 0.2rem 0; }
figure.plot { margin: 0.8rem 0 1.6rem; }
figure.plot svg { max-width: 100%; height: auto; display: block; }
figcaption { color: var(--muted); font-size: 0.9rem; max-width: 62rem; }
.ok { color: var(--ok); font-weight: 600; }
.bad { color: var(--bad); font-weight: 600; }
details { margin: 0.6rem 0; }
summary { cursor: pointer; font-weight: 600; }
pre { background: #f6f6f6; padding: 0.6rem; overflow-x: auto; font-size: 0.82rem; }
progress { width: 100%; height: 1.4rem; margin-top: 0.9rem; }
.state { display: inline-block; padding: 0.1rem 0.6rem; border-radius: 1rem; color: #fff;
  background: var(--none); font-weight: 600; }
.state.running, .state.queued { background: #0072B2; }
.state.succeeded { background: var(--ok); }
.state.failed, .state.cancelled { background: var(--bad); }
@media print { .scroll { overflow: visible; } }
"""

# Nothing may be fetched: no scripts, no remote styles, fonts or images. Inline styles only.
_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
    "form-action 'none'"
)


def _document(title: str, body: str, refresh_s: int | None = None) -> str:
    refresh = f'<meta http-equiv="refresh" content="{refresh_s}">\n' if refresh_s else ""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"{refresh}<title>{_esc(title)}</title>\n<style>{_CSS}</style>\n</head>\n"
        f"<body>\n<main>\n{body}\n</main>\n</body>\n</html>\n"
    )


@dataclass
class Col:
    """A table column; `num` right-aligns it."""

    head: str
    num: bool = False

    @property
    def attr(self) -> str:
        return ' class="num"' if self.num else ""


def _table(cols: Sequence[Col], rows: Iterable[Sequence[str]], table_id: str,
           wide: bool = False) -> str:
    """Cells arrive already escaped (or built from escaped parts). A wide table keeps each
    cell on one line and scrolls sideways instead of wrapping numbers and names."""
    attrs = f' id="{table_id}"' + (' class="wide"' if wide else "")
    head = "".join(f'<th scope="col"{c.attr}>{_esc(c.head)}</th>' for c in cols)
    body = "\n".join(
        "<tr>"
        + "".join(f"<td{c.attr}>{cell}</td>" for c, cell in zip(cols, row, strict=True))
        + "</tr>"
        for row in rows
    )
    return (
        f'<div class="scroll"><table{attrs}><thead><tr>{head}</tr></thead>'
        f"<tbody>\n{body}\n</tbody></table></div>"
    )


def _figure(plot: Plot, caption: str) -> str:
    return (
        f'<figure class="plot" id="{plot.plot_id}" data-series="{len(plot.series)}">'
        f"{plot.svg}<figcaption>{caption}</figcaption></figure>"
    )


def _code(name: str) -> str:
    return f"<code>{_esc(name)}</code>"


def _stitch_cell(row: ResultRow) -> str:
    source, target = stitch_order(row.front_layer, row.back_layer, row.direction)
    return f"{_code(source)} → {_code(target)}"


def _plain(value: Any) -> str:
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


# ------------------------------------------------------------------ report sections


def verdict_sentence(report: Report) -> tuple[str, str]:
    """(verdict word, plain-words explanation); the word is exactly the JSON verdict, or
    "none" when there is none."""
    s = report.summary
    verdict = report.verdict
    meaning = (
        "Similarity is the stitched models' mean agreement with the model they end in, over the "
        f"stitch points, under the {PROTOCOL_LABEL[s.similarity_protocol]} protocol, in the "
        "weaker direction."
    )
    if verdict is None or s.threshold is None:
        return "none", (
            f"No verdict: the spec set no threshold. The similarity is {s.similarity:.3f}. "
            + meaning
        )
    if verdict == "similar":
        return "similar", (
            f"The two models are functionally similar: their similarity, {s.similarity:.3f}, "
            f"reaches the threshold of {s.threshold:.3f}. " + meaning
        )
    return "dissimilar", (
        f"The two models are functionally different: their similarity, {s.similarity:.3f}, "
        f"is below the threshold of {s.threshold:.3f}. " + meaning
    )


def _header(report: Report) -> str:
    front, back = _model_names(report)
    dataset = report.dataset.get("name") or report.dataset.get("id") or _dataset_name(report)
    job = f"job {_code(report.job_id)} · " if report.job_id else ""
    return (
        "<header><h1>Functional similarity report</h1>"
        f'<p class="sub">{_esc(front)} versus {_esc(back)} on {_esc(dataset)} · {job}'
        f"stitch points: {_count_points(report)}"
        f" · objectives: {_esc(', '.join(report.spec.objectives))}</p></header>"
    )


def _dataset_name(report: Report) -> str:
    ds = report.spec.dataset
    return ds if isinstance(ds, str) else ds.path


def _verdict_section(report: Report) -> str:
    word, sentence = verdict_sentence(report)
    extra = ""
    if report.summary.similarity_protocol == "standard":
        extra = (
            "<p>Only the standard protocol ran. It can score networks as similar that process "
            "their inputs differently; read it against the clustered-noise floor, or run the "
            "invariance-aware protocol.</p>"
        )
    return (
        f'<section class="verdict {word}" id="verdict" data-verdict="{word}" '
        'aria-label="Verdict">'
        f'<p>Verdict: <span class="word" id="verdict-word">{word}</span></p>'
        f'<p id="verdict-text">{_esc(sentence)}</p>{extra}</section>'
    )


def _warnings_section(report: Report) -> str:
    if not report.warnings:
        return ""
    # The engine may say the same thing for a result and for its control: say it once.
    items = "".join(f"<li>{_esc(w)}</li>" for w in dict.fromkeys(report.warnings))
    return (
        '<section class="warnings" id="warnings" aria-label="Warnings">'
        f"<strong>Warnings</strong><ul>{items}</ul></section>"
    )


def _models_section(report: Report) -> str:
    cols = [Col("model"), Col("architecture"), Col("checkpoint"), Col("input size", True),
            Col("accuracy", True), Col("CI", True), Col("stitch points")]
    rows = []
    for role, m in (("front", report.front), ("back", report.back)):
        kwargs = ", ".join(f"{k}={v}" for k, v in m.arch_kwargs.items())
        arch = _esc(m.arch) + (f' <span class="kw">({_esc(kwargs)})</span>' if kwargs else "")
        rows.append([
            role, arch, f'<span class="mono">{_esc(m.checkpoint)}</span>', str(m.input_size),
            _num(m.accuracy), _ci(m.accuracy_ci), ", ".join(_code(x) for x in m.layers) or "—",
        ])
    return (
        '<section id="models"><h2>Models and data</h2>'
        "<p>Each model's own accuracy on the test split, the baseline every stitched model is "
        "compared with.</p>"
        + _table(cols, rows, "models-table")
        + _dataset_table(report.dataset)
        + "</section>"
    )


def _dataset_table(dataset: dict[str, Any]) -> str:
    if not dataset:
        return ""
    rows = [[_esc(k), _esc(_plain(v))] for k, v in dataset.items()]
    return "<h3>Dataset</h3>" + _table([Col("field"), Col("value")], rows, "dataset-table")


def summary_cells(report: Report) -> list[tuple[Direction, Objective, dict[str, float]]]:
    """Mean agreement per (direction, objective), keyed by protocol, in report order."""
    table: dict[tuple[Direction, Objective], dict[str, float]] = {}
    for row in report.summary.rows:
        table.setdefault((row.direction, row.objective), {})[row.protocol] = row.mean_agreement
    return [(d, o, v) for (d, o), v in table.items()]


def _summary_section(report: Report) -> str:
    cols = [Col("direction"), Col("objective"), Col("standard", True),
            Col("invariance-aware", True), Col("drop", True)]
    rows = []
    for direction, objective, by_protocol in summary_cells(report):
        std = by_protocol.get("standard")
        inv = by_protocol.get("invariance_aware")
        drop = _num(std - inv) if std is not None and inv is not None else "—"
        rows.append([DIRECTION_LABEL[direction], objective,
                     _num(std) if std is not None else "—",
                     _num(inv) if inv is not None else "—", drop])
    overall = ", ".join(
        f"{_esc(PROTOCOL_LABEL.get(p, p))} {_num(v)}"
        for p, v in report.summary.by_protocol.items()
    )
    return (
        '<section id="summary"><h2>Summary</h2>'
        "<p>Mean agreement over stitch points (rAuA). The drop is standard minus "
        "invariance-aware: how much of the standard score came from features the end model "
        "does not share with the front model.</p>"
        + _table(cols, rows, "summary-table")
        + f"<p>Per protocol, weaker direction: {overall}.</p></section>"
    )


def _agreement_section(report: Report, plots: Sequence[Plot]) -> str:
    intro = (
        "<p>How well the stitched model's predictions agree with those of the model it ends "
        "in (the end model), at each "
        "stitch point from shallow to deep; shaded around each line: its confidence interval. "
        "<strong>Blue, solid:</strong> standard protocol (the stitch is trained on real "
        "images). <strong>Vermillion, dashed:</strong> invariance-aware protocol (the stitch "
        "is trained on inputs the front model cannot tell apart from real ones); the gap "
        "between the two is the functional difference the standard protocol hides. "
        "<strong>Green band:</strong> identity ceiling (the end model stitched into itself). "
        "<strong>Grey hatched band:</strong> clustered-noise floor (what inputs with no "
        "information but class clusters already reach); a score near it says little.</p>"
    )
    figures = "".join(
        _figure(p, _esc(direction_title(report, d)) + ".")
        for p, d in zip(plots, _directions(report), strict=True)
    )
    return f'<section id="agreement"><h2>Agreement versus depth</h2>{intro}{figures}</section>'


def _controls_section(report: Report) -> str:
    if not report.controls:
        return (
            '<section id="controls"><h2>Controls</h2><p>No controls ran. Add '
            '<code>"controls": ["identity", "clustered_noise"]</code> to the spec to draw the '
            "ceiling and the floor.</p></section>"
        )
    cols = [Col("control"), Col("σ", True), Col("direction"), Col("stitch point"),
            Col("objective"), Col("protocol"), Col("agreement", True), Col("CI", True),
            Col("hard agr.", True), Col("accuracy", True), Col("excess agr.", True)]
    rows = [
        [_esc(CONTROL_LABEL.get(c.control or "", c.control or "")),
         f"{c.sigma:g}" if c.sigma is not None else "", DIRECTION_LABEL[c.direction],
         _stitch_cell(c), c.objective, PROTOCOL_LABEL[c.protocol], _num(c.agreement),
         _ci(c.agreement_ci), _num(c.hard_agreement), _num(c.accuracy),
         _num(c.excessive_agreement) if c.excessive_agreement is not None else ""]
        for c in report.controls
    ]
    return (
        '<section id="controls"><h2>Controls</h2>'
        "<p>Identity: the end model (the back model, or the front model in the back → front "
        "direction) stitched into itself at the same layer (expect agreement near 1). "
        "Clustered noise: one random centre per class plus Gaussian noise of scale σ, fed "
        "through the stitch into the end model; the agreement such a contentless input "
        "reaches is the floor for reading a standard-protocol score.</p>"
        + _table(cols, rows, "controls-table", wide=True)
        + "</section>"
    )


def _iri_section(report: Report, plots: Sequence[Plot]) -> str:
    if not plots:
        return ""
    cols = [Col("direction"), Col("from layer"), Col("start median", True),
            Col("median", True), Col("p90", True), Col("max", True), Col("converged"),
            Col("cache"), Col("samples", True), Col("seconds", True)]
    rows = []
    for direction in _directions(report):
        for r in iri_rows(report, direction):
            s = r.iri
            assert s is not None  # iri_rows keeps rows with stats only
            ok = '<span class="ok">yes</span>' if s.converged else '<span class="bad">no</span>'
            source = stitch_order(r.front_layer, r.back_layer, direction)[0]
            rows.append([DIRECTION_LABEL[direction], _code(source),
                         _num(s.start_median), _num(s.median), _num(s.p90), _num(s.max), ok,
                         "hit" if s.cache_hit else "computed", str(s.n), _num(s.seconds, 1)])
    caption = _esc(
        "How closely the synthesised inputs (IRIs) match their source images in the front "
        "model's representation at each stitch point. If they did not converge, the "
        "invariance-aware score is not trustworthy at that point."
    )
    figures = "".join(_figure(p, caption) for p in plots)
    return (
        '<section id="iri"><h2>IRI convergence</h2>'
        f"{figures}{_table(cols, rows, 'iri-table')}</section>"
    )


def _results_section(report: Report) -> str:
    cols = [Col("direction"), Col("stitch point"), Col("objective"),
            Col("protocol"), Col("agreement", True), Col("CI", True), Col("hard agr.", True),
            Col("accuracy", True), Col("penalty", True), Col("error κ", True),
            Col("train loss", True), Col("seconds", True), Col("stitch")]
    rows = [
        [DIRECTION_LABEL[r.direction], _stitch_cell(r), r.objective,
         PROTOCOL_LABEL[r.protocol], _num(r.agreement), _ci(r.agreement_ci),
         _num(r.hard_agreement), _num(r.accuracy), _signed(r.stitching_penalty),
         _num(r.error_consistency), _num(r.train_loss, 4), _num(r.seconds, 1), _esc(r.stitch)]
        for r in report.results
    ]
    return (
        '<section id="results"><h2>All results</h2>'
        "<p>One row per direction, stitch point, objective and protocol. Stitch point: the "
        "layer the stitch reads from → the layer it feeds into (in the back → front "
        "direction, a back-model layer into a front-model layer). Penalty: the receiving "
        "model's accuracy minus the stitched model's. Error κ: Cohen's kappa of the two being "
        "right or wrong on the same samples.</p>"
        + _table(cols, rows, "results-table", wide=True)
        + "</section>"
    )


def _details_section(report: Report) -> str:
    env = "".join(
        f'<tr><th scope="row">{_esc(k)}</th><td><span class="mono">{_esc(_plain(v))}'
        "</span></td></tr>"
        for k, v in report.environment.items()
    )
    spec = json.dumps(report.spec.model_dump(mode="json"), indent=2)
    return (
        '<section id="details"><h2>Run details</h2>'
        f"<details><summary>Environment</summary><table>{env}</table></details>"
        f"<details><summary>Spec (every default filled in)</summary><pre>{_esc(spec)}</pre>"
        "</details></section>"
    )


# ------------------------------------------------------------------ progress page


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    if minutes:
        return f"{minutes} min {secs:02d} s"
    return f"{secs} s"


def _when(moment: datetime | None) -> str:
    return moment.isoformat(sep=" ", timespec="seconds") if moment else "—"


def _progress_bar(job: JobStatus) -> str:
    p = job.progress
    label = f'aria-label="progress of stage {_esc(p.stage)}"'
    if p.total > 0:
        done = min(p.done, p.total)
        pct = 100.0 * done / p.total
        return (
            f'<progress id="progress" value="{done}" max="{p.total}" {label}>{pct:.0f}%'
            f"</progress><p>{done} of {p.total} ({pct:.0f}%)</p>"
        )
    # No total known yet: an indeterminate bar says "working" without inventing a number.
    return f'<progress id="progress" {label}></progress>'


def _error_block(job: JobStatus) -> str:
    if job.error is None:
        return f"<p>The job ended as <strong>{job.state}</strong>.</p>"
    return (
        '<section class="verdict dissimilar" id="error"><p>The job ended as '
        f"<strong>{job.state}</strong>: {_code(job.error.code)}</p>"
        f"<p>{_esc(job.error.message)}</p></section>"
    )


def _job_facts(job: JobStatus) -> str:
    facts: list[tuple[str, str]] = [
        ("created", _when(job.created_at)),
        ("started", _when(job.started_at)),
        ("finished", _when(job.finished_at)),
        ("attempts", str(job.attempts)),
    ]
    if job.spec is not None:
        s = job.spec
        facts += [
            ("front", s.front.arch or "from checkpoint metadata"),
            ("back", s.back.arch or "from checkpoint metadata"),
            ("dataset", s.dataset if isinstance(s.dataset, str) else s.dataset.path),
            ("stitch points", "auto" if s.layers == "auto" else f"{len(s.layers)} pair(s)"),
            ("objectives", ", ".join(s.objectives)),
            ("protocols", ", ".join(PROTOCOL_LABEL[p] for p in s.protocols)),
        ]
    rows = "".join(f'<tr><th scope="row">{_esc(k)}</th><td>{_esc(v)}</td></tr>'
                   for k, v in facts)
    return f'<h2>Job</h2><table id="job-table">{rows}</table>'


def render_progress_page(job: JobStatus) -> str:
    """What /jobs/{id}/report.html shows before the report exists; reloads while running."""
    active = job.state in ("queued", "running")
    p = job.progress
    parts = [
        f"<header><h1>Job {_code(job.id)}</h1>",
        f'<p class="sub">state: <span class="state {job.state}" id="state">{job.state}</span>'
        f' · stage: <strong id="stage">{_esc(p.stage)}</strong></p></header>',
    ]
    if active:
        eta = f"about {_duration(p.eta_s)}" if p.eta_s is not None else "not known yet"
        parts += [
            _progress_bar(job),
            f'<p id="eta">Time left: {eta}.</p>',
            f'<p class="sub">This page reloads every {REFRESH_SECONDS} s and turns into the '
            "report when the job has finished.</p>",
        ]
    elif job.state == "succeeded":
        parts.append('<p>The job has finished. <a href="report.html">Open the report</a>.</p>')
    else:
        parts.append(_error_block(job))
    parts.append(_job_facts(job))
    refresh = REFRESH_SECONDS if active else None
    return _document(f"stitchsim job {job.id}: {job.state}", "".join(parts), refresh_s=refresh)


def render_report_page(report: Report) -> str:
    """The finished job's report as one self-contained HTML page."""
    directions = _directions(report)
    agreement = [agreement_plot(report, d) for d in directions]
    iri = [p for p in (iri_plot(report, d) for d in directions) if p is not None]
    body = "".join([
        _header(report),
        _verdict_section(report),
        _warnings_section(report),
        _models_section(report),
        _summary_section(report),
        _agreement_section(report, agreement),
        _controls_section(report),
        _iri_section(report, iri),
        _results_section(report),
        _details_section(report),
    ])
    title = f"stitchsim: {report.front.arch} vs {report.back.arch} — {verdict_sentence(report)[0]}"
    return _document(title, body)


def render_job_page(job: JobStatus, report: Report | None) -> str:
    """The page of GET /jobs/{id}/report.html: the report once there is one, else progress."""
    if report is not None:
        return render_report_page(report)
    return render_progress_page(job)
