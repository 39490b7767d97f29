"""`stitchsim compare`, `jobs` and `report`: start comparisons, follow jobs, fetch reports."""

from __future__ import annotations

import argparse
from typing import TextIO

from stitchsim.cli.dataset import pack_options
from stitchsim.cli.exits import (
    EXIT_PASS,
    log,
)
from stitchsim.cli.output import (
    progress_text,
    table_text,
    wait_for,
    write_file,
    write_outputs,
)
from stitchsim.cli.spec_args import client_for, settings_from, spec_fields
from stitchsim.config import Settings
from stitchsim.sdk import Job


def cmd_compare(args: argparse.Namespace, out: TextIO) -> int:
    settings = settings_from(args)
    fields = spec_fields(args, settings)
    with client_for(settings) as client:
        job = client.compare(args.front, args.back, spec=fields,
                             dataset_options=pack_options(args))
        if not args.wait:
            print(job.id, file=out)
            return EXIT_PASS
        return wait_and_print(job, args, settings, out)


def wait_and_print(job: Job, args: argparse.Namespace, settings: Settings,
                    out: TextIO) -> int:
    report = wait_for(job, args, settings, cancel=False)
    write_outputs(job, args)
    print(table_text(report), file=out)
    return EXIT_PASS


def cmd_jobs_list(args: argparse.Namespace, out: TextIO) -> int:
    with client_for(settings_from(args)) as client:
        limit = getattr(args, "limit", 20)
        page = client.jobs(limit=limit)
    if getattr(args, "as_json", False):
        print(page.model_dump_json(indent=2), file=out)
        return EXIT_PASS
    if not page.items:
        print("no jobs", file=out)
        return EXIT_PASS
    rows = [("JOB", "STATE", "PROGRESS", "CREATED", "FINISHED")]
    for j in page.items:
        rows.append(
            (
                j.id,
                j.state,
                progress_text(j),
                j.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                j.finished_at.strftime("%Y-%m-%d %H:%M:%S") if j.finished_at else "",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip(), file=out)
    if page.next_cursor:
        print(f"(more: --limit {limit * 2})", file=out)
    return EXIT_PASS


def cmd_jobs_show(args: argparse.Namespace, out: TextIO) -> int:
    with client_for(settings_from(args)) as client:
        status = client.job(args.job_id).status()
    if getattr(args, "as_json", False):
        print(status.model_dump_json(indent=2, exclude={"spec"}), file=out)
        return EXIT_PASS
    print(f"job       {status.id}", file=out)
    print(f"state     {status.state}", file=out)
    print(f"progress  {progress_text(status)}", file=out)
    for name in ("created_at", "started_at", "finished_at"):
        value = getattr(status, name)
        if value:
            print(f"{name.split('_')[0]:<9} {value.isoformat()}", file=out)
    if status.attempts:
        print(f"attempts  {status.attempts}", file=out)
    if status.error:
        print(f"error     {status.error.message} ({status.error.code})", file=out)
    return EXIT_PASS


def cmd_jobs_cancel(args: argparse.Namespace, out: TextIO) -> int:
    with client_for(settings_from(args)) as client:
        status = client.job(args.job_id).cancel()
    print(f"{status.id}: {status.state}", file=out)
    return EXIT_PASS


def cmd_jobs_wait(args: argparse.Namespace, out: TextIO) -> int:
    settings = settings_from(args)
    with client_for(settings) as client:
        return wait_and_print(client.job(args.job_id), args, settings, out)


def cmd_report(args: argparse.Namespace, out: TextIO) -> int:
    with client_for(settings_from(args)) as client:
        job = client.job(args.job_id)
        if args.format == "json":
            text = job.report_json()
        elif args.format == "html":
            text = job.report_html()
        else:
            text = table_text(job.report())
    if args.output:
        write_file(args.output, text)
        log.info("wrote %s", args.output)
    else:
        out.write(text if text.endswith("\n") else text + "\n")
    return EXIT_PASS
