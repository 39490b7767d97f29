"""Where people read results: a report's tidy tables as pandas DataFrames (the `pandas`
extra), and the HTML a notebook shows for a report or a job (standard library only)."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from stitchsim import view
from stitchsim.errors import MissingExtra
from stitchsim.models import FigureRow, JobStatus, Report

if TYPE_CHECKING:
    import pandas

TABLES = ("results", "controls", "measures", "summary")


def report_records(report: Report, table: str = "results") -> list[dict[str, Any]]:
    """One flat dict per row: nested figures become columns (agreement_ci -> agreement_ci_low,
    agreement_ci_high; iri.median -> iri_median), so the table has one value per cell."""
    if table == "results":
        rows: list[Any] = report.results
    elif table == "controls":
        rows = report.controls
    elif table == "measures":
        rows = [*report.measures, *report.measure_controls]
    elif table == "summary":
        rows = report.summary.rows
    else:
        raise ValueError(f"table: one of {', '.join(TABLES)}, not {table!r}")
    return [_record(r) for r in rows]


def _record(row: Any) -> dict[str, Any]:
    """A row's fields, nested ones flattened; a result row's figures as the view flattens
    them (the read-only format-1 fields restate figures, so they stay out)."""
    if not isinstance(row, FigureRow):
        return _flat(row.model_dump(mode="json"))
    fields = row.model_dump(mode="json", exclude={"figures", *type(row).model_computed_fields})
    return {**_flat(fields), **view.figure_records(row)}


def report_frame(report: Report, table: str = "results") -> pandas.DataFrame:
    try:
        import pandas as pd
    except ImportError:
        raise MissingExtra("Report.to_pandas needs pandas: pip install 'stitchsim[pandas]'"
                           ) from None
    records = report_records(report, table)
    frame = pd.DataFrame.from_records(records)
    frame.attrs.update(job_id=report.job_id, similarity=report.summary.similarity,
                       verdict=report.verdict)
    return frame


def _flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, f"{name}_"))
        elif isinstance(value, list | tuple) and len(value) == 2 and key.endswith("ci"):
            out[f"{name}_low"], out[f"{name}_high"] = value
        elif value is None and key in ("iri", "robust"):
            continue  # absent nested figures: no column of Nones
        else:
            out[name] = value
    return out


# ------------------------------------------------------------------ notebook HTML


def report_html(report: Report) -> str:
    """A compact card: verdict, similarity per protocol, models, caveats, points."""
    s = report.summary
    v = view.verdict_view(report)
    rows = "".join(f"<tr><td>{_e(p)}</td><td>{f:.4f}</td></tr>" for p, f in s.by_protocol.items())
    models = "".join(
        f"<tr><td>{side}</td><td>{_e(m.arch)}</td><td>{m.accuracy:.3f}</td>"
        f"<td><code>{_e(m.checkpoint[:19])}…</code></td></tr>"
        for side, m in (("front", report.front), ("back", report.back)))
    caveats = "".join(f"<li>{_e(c)}</li>" for c in report.verdict_caveats)
    job = f" job <code>{_e(report.job_id)}</code>" if report.job_id else ""
    return (
        f'<div class="stitchsim-report"><b>stitchsim report</b>{job}: verdict '
        f"<b>{_e(v.word)}</b>, similarity <b>{s.similarity:.4f}</b>"
        + (f" (threshold {s.threshold:.3f})" if s.threshold is not None else "")
        + f"<p>{_e(v.sentence)}</p>"
        f"<table><tr><th>protocol</th><th>weaker direction</th></tr>{rows}</table>"
        f"<table><tr><th>model</th><th>arch</th><th>accuracy</th><th>checkpoint</th></tr>"
        f"{models}</table>"
        + (f"<p>Caveats:</p><ul>{caveats}</ul>" if caveats else "")
        + "</div>"
    )


def status_html(job_id: str, status: JobStatus | None) -> str:
    """A job's state and progress as the last status request saw it (no request made)."""
    if status is None:
        return f"<div><b>stitchsim job</b> <code>{_e(job_id)}</code>: state unknown " \
               "(call .status())</div>"
    p = status.progress
    bar = ""
    if p.total:
        bar = f' <progress value="{p.done}" max="{p.total}"></progress> {p.done}/{p.total}'
    eta = f", about {p.eta_s:.0f} s left" if p.eta_s and status.state == "running" else ""
    error = f"<br>{_e(status.error.code)}: {_e(status.error.message)}" if status.error else ""
    return (f"<div><b>stitchsim job</b> <code>{_e(job_id)}</code>: <b>{_e(status.state)}</b>"
            f" ({_e(p.stage)}){bar}{eta}{error}</div>")


def _e(text: object) -> str:
    return html.escape(str(text))
