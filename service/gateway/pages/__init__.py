"""The human-readable pages of a job: the finished report with plots, and a self-refreshing
progress page while the job runs.

The gateway has no torch, so these modules need only the contract (its report view), the
standard library and matplotlib. Every page is self-contained (inline CSS and inline SVG, no
script, no external asset) and carries a Content-Security-Policy that forbids loading
anything, so it works offline and an injected string could not pull anything in even if
escaping failed somewhere.

    html      the document shell, tables, figures, escaping
    plots     agreement versus depth, IRI convergence (inline SVG)
    measures  similarity measures versus depth beside agreement, and their tables
    sections  the report page's sections, in reading order
    progress  the page of a job that has no report yet
"""

from __future__ import annotations

from stitchsim import view
from stitchsim.models import JobStatus, Report
from stitchsim_service.gateway.pages import sections
from stitchsim_service.gateway.pages.html import document
from stitchsim_service.gateway.pages.measures import measures_plot, measures_section
from stitchsim_service.gateway.pages.outputs import outputs_section
from stitchsim_service.gateway.pages.plots import agreement_plot, iri_plot
from stitchsim_service.gateway.pages.progress import REFRESH_SECONDS, render_progress_page

__all__ = ["REFRESH_SECONDS", "render_job_page", "render_progress_page", "render_report_page"]


def render_report_page(report: Report) -> str:
    """The finished job's report as one self-contained HTML page."""
    directions = view.directions(report)
    agreement = [agreement_plot(report, d) for d in directions]
    iri = [p for p in (iri_plot(report, d) for d in directions) if p is not None]
    measured = [p for p in (measures_plot(report, d) for d in directions) if p is not None]
    body = "".join([
        sections.header(report),
        sections.verdict_section(report),
        sections.near_chance_section(report),
        sections.warnings_section(report),
        sections.notes_section(report),
        sections.models_section(report),
        outputs_section(report),
        sections.summary_section(report),
        sections.agreement_section(report, agreement),
        sections.probes_section(report),
        measures_section(report, measured),
        sections.controls_section(report),
        sections.iri_section(report, iri),
        sections.results_section(report),
        sections.details_section(report),
    ])
    verdict = view.verdict_view(report).word
    return document(f"stitchsim: {report.front.arch} vs {report.back.arch} — {verdict}", body)


def render_job_page(job: JobStatus, report: Report | None) -> str:
    """The page of GET /jobs/{id}/report.html: the report once there is one, else progress."""
    if report is not None:
        return render_report_page(report)
    return render_progress_page(job)
