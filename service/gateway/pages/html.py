"""The HTML kit of the pages: the document shell (inline CSS, a Content-Security-Policy that
forbids loading anything), tables, figures and escaping.

Every string that comes from a user (architecture, layer and dataset names, checkpoint ids,
warnings, error messages) goes through `esc` before it reaches the HTML; table cells arrive
escaped (or built from escaped parts).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from stitchsim import view
from stitchsim.models import ResultRow


def esc(value: object) -> str:
    return escape(str(value), quote=True)

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
.alert { border: 3px solid var(--bad); border-left-width: 12px; border-radius: 6px;
  background: #fde7dc; padding: 0.7rem 1.1rem; margin: 1rem 0; }
.alert strong { color: var(--bad); font-size: 1.15rem; }
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


def document(title: str, body: str, refresh_s: int | None = None) -> str:
    refresh = f'<meta http-equiv="refresh" content="{refresh_s}">\n' if refresh_s else ""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"{refresh}<title>{esc(title)}</title>\n<style>{_CSS}</style>\n</head>\n"
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


def table(cols: Sequence[Col], rows: Iterable[Sequence[str]], table_id: str,
           wide: bool = False) -> str:
    """Cells arrive already escaped (or built from escaped parts). A wide table keeps each
    cell on one line and scrolls sideways instead of wrapping numbers and names."""
    attrs = f' id="{table_id}"' + (' class="wide"' if wide else "")
    head = "".join(f'<th scope="col"{c.attr}>{esc(c.head)}</th>' for c in cols)
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


def figure(plot_id: str, svg: str, n_series: int, caption: str) -> str:
    return (
        f'<figure class="plot" id="{plot_id}" data-series="{n_series}">'
        f"{svg}<figcaption>{caption}</figcaption></figure>"
    )


def code(name: str) -> str:
    return f"<code>{esc(name)}</code>"


def stitch_cell(row: ResultRow) -> str:
    source, target = view.stitch_order(row.front_layer, row.back_layer, row.direction)
    return f"{code(source)} → {code(target)}"


def plain(value: Any) -> str:
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
