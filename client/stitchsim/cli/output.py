"""Waiting for a job and writing what it produced: progress, report files, the table."""

from __future__ import annotations

import argparse
from pathlib import Path

from stitchsim.cli.exits import (
    log,
)
from stitchsim.config import Settings
from stitchsim.errors import (
    StitchsimError,
    UsageError,
    WaitTimeout,
)
from stitchsim.models import JobStatus, Report
from stitchsim.sdk import Job, ProgressPrinter


def wait_for(job: Job, args: argparse.Namespace, settings: Settings, *, cancel: bool) -> Report:
    quiet = getattr(args, "quiet", False)
    printer = None
    if args.progress != "none" and not quiet:
        printer = ProgressPrinter(job_id=job.id, mode=args.progress)
    try:
        return job.wait(settings.timeout, progress=printer or False)
    except (WaitTimeout, KeyboardInterrupt):
        if cancel:
            cancel_quietly(job)
        raise
    finally:
        if printer is not None:
            printer.close()


def cancel_quietly(job: Job) -> None:
    # Best effort: a CI job that gave up should not leave a GPU busy, but a failure to cancel
    # must not hide why we gave up.
    try:
        job.client.http.request("DELETE", f"/jobs/{job.id}", retries=1)
        log.info("job %s cancelled", job.id)
    except StitchsimError as exc:
        log.warning("could not cancel job %s: %s", job.id, exc)


def write_outputs(job: Job, args: argparse.Namespace) -> None:
    if getattr(args, "json", None):
        write_file(args.json, job.report_json())
        log.info("wrote %s", args.json)
    if getattr(args, "html", None):
        write_file(args.html, job.report_html())
        log.info("wrote %s", args.html)


def write_file(path: str, text: str) -> None:
    try:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None


def table_text(report: Report) -> str:
    from stitchsim.table import format_table

    return format_table(report)


def progress_text(status: JobStatus) -> str:
    p = status.progress
    if status.state in ("queued", "running") and p.total:
        return f"{p.stage} {p.done}/{p.total}"
    return p.stage if status.state == "running" else ""
