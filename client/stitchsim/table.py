"""A compact, aligned terminal table of a report, for `stitchsim check` and
`stitchsim-server run`.

Standard library only (this module ships in the light client). The output is plain ASCII so
it survives any CI log and any console encoding, and every user-supplied string (layer and
architecture names) is stripped of control characters so a crafted name cannot move the
cursor or recolour the terminal.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from stitchsim.models import Report, ResultRow

MAX_NAME = 40
"""Longer layer names are cut in the middle; the JSON report keeps them whole."""

DIRECTION = {"front_to_back": "front->back", "back_to_front": "back->front"}


def _clean(text: str, limit: int = MAX_NAME) -> str:
    # Escapes instead of raw control characters (ANSI sequences, newlines, tabs).
    safe = "".join(
        ch if ch.isprintable() and ch.isascii() else ascii(ch)[1:-1] for ch in text
    )
    if len(safe) <= limit:
        return safe
    keep = limit - 3
    return safe[: (keep + 1) // 2] + "..." + safe[len(safe) - keep // 2 :]


def fmt(value: float | None, digits: int = 3) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:.{digits}f}"


def fmt_signed(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:+.3f}"


def _with_ci(value: float, ci: Sequence[float]) -> str:
    return f"{fmt(value)} [{fmt(ci[0])}, {fmt(ci[1])}]"


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


def _order(rows: Sequence[ResultRow]) -> list[ResultRow]:
    """Direction, then depth (report order of the stitch pairs), then objective, protocol, so
    the standard and invariance-aware lines of one stitch point sit together."""
    pairs: dict[tuple[str, str, str], int] = {}
    for r in rows:
        pairs.setdefault((r.direction, r.front_layer, r.back_layer), len(pairs))
    directions = ("front_to_back", "back_to_front")
    objectives = ("hlm", "slm", "dm", "fula")
    protocols = ("standard", "invariance_aware")
    return sorted(rows, key=lambda r: (
        directions.index(r.direction), pairs[(r.direction, r.front_layer, r.back_layer)],
        objectives.index(r.objective), protocols.index(r.protocol),
    ))


def _layers(row: ResultRow) -> str:
    """The stitch in reading order: the layer it reads from -> the layer it feeds into. Rows
    name layers by model (the spec's front and back), so back->front reverses them."""
    source, target = row.front_layer, row.back_layer
    if row.direction == "back_to_front":
        source, target = target, source
    return f"{_clean(source)} -> {_clean(target)}"


def results_lines(report: Report) -> list[str]:
    headers = ["direction", "stitch: from -> into", "objective", "protocol", "agreement [CI]",
               "hard agr", "accuracy", "penalty"]
    rows = [
        [DIRECTION[r.direction], _layers(r), r.objective, r.protocol,
         _with_ci(r.agreement, r.agreement_ci), fmt(r.hard_agreement), fmt(r.accuracy),
         fmt_signed(r.stitching_penalty)]
        for r in _order(report.results)
    ]
    return _align(headers, rows, numeric={4, 5, 6, 7})


def controls_lines(report: Report) -> list[str]:
    headers = ["control", "sigma", "direction", "stitch: from -> into", "objective", "protocol",
               "agreement [CI]", "hard agr", "accuracy", "excess agr"]
    rows = [
        [c.control or "", f"{c.sigma:g}" if c.sigma is not None else "", DIRECTION[c.direction],
         _layers(c), c.objective, c.protocol, _with_ci(c.agreement, c.agreement_ci),
         fmt(c.hard_agreement), fmt(c.accuracy),
         fmt(c.excessive_agreement) if c.excessive_agreement is not None else ""]
        for c in report.controls
    ]
    return _align(headers, rows, numeric={1, 6, 7, 8, 9})


def summary_lines(report: Report) -> list[str]:
    """Mean agreement over stitch points per direction and objective, with the drop."""
    cells: dict[tuple[str, str], dict[str, float]] = {}
    for row in report.summary.rows:
        cells.setdefault((row.direction, row.objective), {})[row.protocol] = row.mean_agreement
    rows = []
    for (direction, objective), by_protocol in cells.items():
        std = by_protocol.get("standard")
        inv = by_protocol.get("invariance_aware")
        drop = fmt(std - inv) if std is not None and inv is not None else "-"
        rows.append([DIRECTION.get(direction, direction), objective,
                     fmt(std) if std is not None else "-",
                     fmt(inv) if inv is not None else "-", drop])
    headers = ["direction", "objective", "standard", "invariance_aware", "drop"]
    return _align(headers, rows, numeric={2, 3, 4})


def verdict_line(report: Report) -> str:
    s = report.summary
    verdict = report.verdict
    figure = f"similarity {s.similarity:.3f} ({s.similarity_protocol}, weaker direction)"
    if verdict is None or s.threshold is None:
        return f"VERDICT: none (no threshold set); {figure}"
    relation = ">=" if verdict == "similar" else "<"
    return f"VERDICT: {verdict.upper()}  {figure} {relation} threshold {s.threshold:.3f}"


def _model_line(role: str, report: Report) -> str:
    m = report.front if role == "front" else report.back
    return (f"{role}: {_clean(m.arch)}  accuracy {_with_ci(m.accuracy, m.accuracy_ci)}  "
            f"checkpoint {_clean(m.checkpoint, 24)}")


def format_table(report: Report) -> str:
    """The whole report as aligned plain text; the verdict is the last line."""
    lines = [_model_line("front", report), _model_line("back", report), ""]
    lines += results_lines(report)
    if report.controls:
        lines += ["", "controls"] + controls_lines(report)
    lines += ["", "mean agreement over stitch points"] + summary_lines(report)
    by_protocol = ", ".join(f"{p} {fmt(v)}" for p, v in report.summary.by_protocol.items())
    if by_protocol:
        lines.append(f"weaker direction: {by_protocol}")
    if report.warnings:
        unique = dict.fromkeys(report.warnings)  # a result and its control may repeat one
        lines += ["", "warnings"] + [f"  - {_clean(w, 500)}" for w in unique]
    lines += ["", verdict_line(report)]
    return "\n".join(lines)
