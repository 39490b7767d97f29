"""The page of a job that has no report yet: state, stage, a progress bar and the time left,
reloading itself every few seconds while the job is queued or running."""

from __future__ import annotations

from datetime import datetime

from stitchsim import catalogue
from stitchsim.models import ACTIVE_STATES, JobStatus
from stitchsim_service.gateway.pages.html import code, document, esc

REFRESH_SECONDS = 5
"""How often the progress page reloads itself while the job is queued or running."""

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
    label = f'aria-label="progress of stage {esc(p.stage)}"'
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
        f"<strong>{job.state}</strong>: {code(job.error.code)}</p>"
        f"<p>{esc(job.error.message)}</p></section>"
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
            ("protocols", ", ".join(catalogue.PROTOCOLS.label(p) for p in s.protocols)),
        ]
    rows = "".join(f'<tr><th scope="row">{esc(k)}</th><td>{esc(v)}</td></tr>'
                   for k, v in facts)
    return f'<h2>Job</h2><table id="job-table">{rows}</table>'


def render_progress_page(job: JobStatus) -> str:
    """What /jobs/{id}/report.html shows before the report exists; reloads while running."""
    active = job.state in ACTIVE_STATES
    p = job.progress
    parts = [
        f"<header><h1>Job {code(job.id)}</h1>",
        f'<p class="sub">state: <span class="state {job.state}" id="state">{job.state}</span>'
        f' · stage: <strong id="stage">{esc(p.stage)}</strong></p></header>',
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
    return document(f"stitchsim job {job.id}: {job.state}", "".join(parts), refresh_s=refresh)
