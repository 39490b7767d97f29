"""A compact, aligned terminal table of a report, for `stitchsim check` and
`stitchsim-server run`.

It renders the report's view (`stitchsim.view`) with the standard library only (this module
ships in the light client). The output is plain ASCII so
it survives any CI log and any console encoding, and every user-supplied string (layer and
architecture names) is stripped of control characters so a crafted name cannot move the
cursor or recolour the terminal.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from stitchsim import catalogue, view
from stitchsim.models import FigureRow, Report, ResultRow
from stitchsim.view import DIRECTION_ASCII, fmt, fmt_signed

MAX_NAME = 40
"""Longer layer names are cut in the middle; the JSON report keeps them whole."""


def _clean(text: str, limit: int = MAX_NAME) -> str:
    # Escapes instead of raw control characters (ANSI sequences, newlines, tabs).
    safe = "".join(
        ch if ch.isprintable() and ch.isascii() else ascii(ch)[1:-1] for ch in text
    )
    if len(safe) <= limit:
        return safe
    keep = limit - 3
    return safe[: (keep + 1) // 2] + "..." + safe[len(safe) - keep // 2 :]


def _with_ci(value: float | None, ci: Sequence[float] | None) -> str:
    return f"{fmt(value)} {view.fmt_ci(ci)}"


def _align(headers: Sequence[str], rows: Iterable[Sequence[str]], numeric: set[int]) -> list[str]:
    """Columns padded to their widest cell; numbers right-aligned so decimals line up."""
    body = [list(r) for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h)
              for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        padded = (
            c.rjust(w) if i in numeric else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )
        return "  ".join(padded).rstrip()

    return [line(headers), "  ".join("-" * w for w in widths), *(line(r) for r in body)]


def _layers(row: ResultRow) -> str:
    """The stitch in reading order: the layer it reads from -> the layer it feeds into."""
    source, target = view.stitch_order(row.front_layer, row.back_layer, row.direction)
    return f"{_clean(source)} -> {_clean(target)}"  # each name cleaned and cut on its own


def _figure_headers(columns: Sequence[catalogue.RowFigureEntry]) -> list[str]:
    return [view.figure_header(c) + (" [CI]" if c.interval_shown else "") for c in columns]


def _figure_cells(row: FigureRow, columns: Sequence[catalogue.RowFigureEntry]) -> list[str]:
    return [_with_ci(row.value(c.name), row.interval(c.name)) if c.interval_shown
            else view.figure_text(row, c) for c in columns]


def results_lines(report: Report) -> list[str]:
    columns = view.figure_columns(report.results)
    headers = ["direction", "stitch: from -> into", "objective", "protocol",
               *_figure_headers(columns), "penalty"]
    robust = view.has_robust(report)
    rows = [
        [DIRECTION_ASCII[r.direction], _layers(r), r.objective, view.protocol_name(r),
         *_figure_cells(r, columns), fmt_signed(r.stitching_penalty),
         *([view.robust_agreement(r), view.transfer_rate(r)] if robust else [])]
        for r in view.ordered(report.results)
    ]
    headers += ["robust agr", "transfer"] if robust else []
    lines = _align(headers, rows, numeric=set(range(4, len(headers))))
    return [*lines, view.robust_caption(report)] if robust else lines


def unstitched_lines(report: Report) -> list[str]:
    """The endpoint: the two whole models against each other, no stitch."""
    columns = view.figure_columns(report.unstitched_agreement)
    headers = ["direction", *_figure_headers(columns)]
    rows = [[DIRECTION_ASCII[u.direction], *_figure_cells(u, columns)]
            for u in report.unstitched_agreement]
    return _align(headers, rows, numeric=set(range(1, len(headers))))


def controls_lines(report: Report) -> list[str]:
    columns = view.figure_columns(report.controls)
    headers = ["control", "sigma", "direction", "stitch: from -> into", "objective", "protocol",
               *_figure_headers(columns), "excess agr"]
    rows = [
        [(c.control or "") + (f":{c.cue}" if c.cue else ""),
         f"{c.sigma:g}" if c.sigma is not None else "",
         DIRECTION_ASCII[c.direction], _layers(c), c.objective, c.protocol,
         *_figure_cells(c, columns),
         fmt(c.excessive_agreement) if c.excessive_agreement is not None else ""]
        for c in report.controls
    ]
    return _align(headers, rows, numeric={1, *range(6, len(headers))})


def measures_lines(report: Report) -> list[str]:
    """Every measure row and its ceiling and floor, in depth order."""
    headers = ["direction", "stitch: from -> into", "measure", "input", "control", "value [CI]",
               "samples"]
    rows = [
        [DIRECTION_ASCII[m.direction],
         f"{_clean(view.stitch_order(m.front_layer, m.back_layer, m.direction)[0])} -> "
         f"{_clean(view.stitch_order(m.front_layer, m.back_layer, m.direction)[1])}",
         m.measure, f"{m.input} ({m.split})",
         (m.control or "") + (f" s={m.sigma:g}" if m.sigma is not None else ""),
         _with_ci(m.value, m.ci), str(m.samples)]
        for m in view.ordered_measures(report.measures + report.measure_controls)
    ]
    return _align(headers, rows, numeric={5, 6})


def measure_summary_lines(report: Report) -> list[str]:
    rows = [
        [DIRECTION_ASCII[m.direction], m.measure, fmt(m.real), fmt(m.iri), fmt_signed(m.gap)]
        for m in view.measure_summary(report)
    ]
    return _align(["direction", "measure", "real", "iri", "gap"], rows, numeric={2, 3, 4})


def summary_lines(report: Report) -> list[str]:
    """Mean agreement over stitch points per direction and objective, with the drop."""
    rows = [
        [DIRECTION_ASCII.get(line.direction, line.direction), line.objective,
         fmt(line.baseline) if line.baseline is not None else "-",
         fmt(line.iri) if line.iri is not None else "-",
         fmt(line.drop) if line.drop is not None else "-"]
        for line in view.summary_lines(report)
    ]
    headers = ["direction", "objective", *catalogue.drop_protocols(), "drop"]
    return _align(headers, rows, numeric={2, 3, 4})


def excess_lines(report: Report) -> list[str]:
    """The unseen-cue suite's excessive agreement, maximised over stitch points."""
    headers = ["direction", "cue", "protocol", "objective", "max excess agr", "at"]
    rows = [
        [DIRECTION_ASCII[e.direction], e.cue, e.protocol, e.objective,
         fmt(e.max_excessive_agreement), _clean(e.front_layer)]
        for e in report.summary.excessive_agreement
    ]
    return _align(headers, rows, numeric={4})


def verdict_line(report: Report) -> str:
    s = report.summary
    verdict = report.verdict
    figure = f"similarity {s.similarity:.3f} ({s.similarity_protocol}, weaker direction)"
    if verdict is None:
        why = "no threshold set" if report.verdict_reason is None else "see why above"
        return f"VERDICT: none ({why}); {figure}"
    relation = ">=" if verdict == "similar" else "<"
    threshold = fmt(s.threshold)
    return f"VERDICT: {verdict.upper()}  {figure} {relation} threshold {threshold}"


def _model_lines(role: str, report: Report) -> list[str]:
    m = report.front if role == "front" else report.back
    chance = "  AT CHANCE" if m.near_chance else ""
    scored = (f"accuracy {_with_ci(m.accuracy, m.accuracy_ci)}" if m.accuracy is not None
              else f"output {view.output_text(m)}")
    lines = [f"{role}: {_clean(m.arch)}  {scored}  "
             f"checkpoint {_clean(m.checkpoint, 24)}{chance}"]
    if m.preprocess is not None:
        lines.append(f"  input: {_clean(view.preprocess_text(m.preprocess), 500)}")
    return lines


def _notes(title: str, items: Iterable[str]) -> list[str]:
    unique = list(dict.fromkeys(items))  # a result and its control may repeat one
    return ["", title, *(f"  - {_clean(w, 500)}" for w in unique)] if unique else []


def iri_lines(report: Report) -> list[str]:
    """Per direction and stitch point the IRIs were made for: their median distance, whether
    it is under the convergence line, and the steps a sample took (the budget beside it)."""
    headers = ["direction", "IRIs at", "median", "p90", "converged", "steps used / cap",
               "pixel median"]
    rows = [
        [DIRECTION_ASCII[r.direction],
         _clean(view.stitch_order(r.front_layer, r.back_layer, r.direction)[0]),
         fmt(r.iri.median), fmt(r.iri.p90), "yes" if r.iri.converged else "NO",
         (f"{r.iri.steps_used:.0f}" if r.iri.steps_used is not None else "-")
         + f" / {r.iri.steps}", fmt(r.iri.pixel_median)]
        for direction in DIRECTION_ASCII
        for r in view.iri_rows(report, direction)  # type: ignore[arg-type]
        if r.iri is not None
    ]
    return _align(headers, rows, numeric={2, 3, 5, 6})


def probe_lines(report: Report) -> list[str]:
    """Each probe set: the models alone on it, then its stitch rows and endpoint as the clean
    set's (the same tables, on the probe's rows)."""
    lines: list[str] = []
    for probe, line in zip(report.probes, view.probe_lines(report), strict=True):
        on_probe = report.model_copy(update={"results": probe.results,
                                             "unstitched_agreement": probe.unstitched_agreement})
        lines += ["", f"probe {_clean(probe.name)} ({line.samples} images): accuracy front "
                  f"{view.fmt(probe.front_accuracy)}, back {view.fmt(probe.back_accuracy)}"]
        lines += results_lines(on_probe)
        if probe.unstitched_agreement:
            lines += [f"no stitch on probe {_clean(probe.name)}"] + unstitched_lines(on_probe)
    return lines


def format_table(report: Report) -> str:
    """The whole report as aligned plain text; the verdict is the last line."""
    lines = [*_model_lines("front", report), *_model_lines("back", report), ""]
    lines += results_lines(report)
    if report.unstitched_agreement:
        lines += ["", "no stitch (whole models against each other: the endpoint)"]
        lines += unstitched_lines(report)
    lines += probe_lines(report)
    if report.controls:
        lines += ["", "controls"] + controls_lines(report)
    if any(r.iri is not None for r in report.results):
        lines += ["", f"IRIs ({view.iri_method(report)})"] + iri_lines(report)
    lines += ["", "mean agreement over stitch points"] + summary_lines(report)
    if report.summary.by_protocol:
        lines.append(f"weaker direction: {view.overall_line(report)}")
    if report.summary.excessive_agreement:
        lines += ["", "excessive agreement (unseen cues), max over stitch points"]
        lines += excess_lines(report)
    lines += _notes("notes", report.notes)
    if report.measures:
        lines += ["", "similarity measures (no fitting; real inputs vs the front model's IRIs)"]
        lines += measures_lines(report)
        lines += ["", "mean measure over stitch points"] + measure_summary_lines(report)
        weaker = report.summary.measure_weaker_direction
        if weaker:
            lines.append("weaker conditional on IRIs: " + ", ".join(
                f"{m} {DIRECTION_ASCII[d]}" for m, d in weaker.items()))
    lines += _notes("warnings", view.warnings(report))
    reason = report.verdict_reason
    if reason:
        lines += _notes("no verdict, because", [reason])
    lines += _notes("verdict caveats", report.verdict_caveats)
    lines += ["", verdict_line(report)]
    return "\n".join(lines)
