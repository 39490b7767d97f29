"""GET/DELETE /jobs: status, progress, reports, cancellation."""

from __future__ import annotations

import binascii
import json
from datetime import datetime, timezone
from typing import Literal

from anyio import to_thread
from fastapi import APIRouter, Depends, Query, Response
from fastapi.responses import HTMLResponse
from stitchsim.models import ErrorBody, JobList, JobStatus, Report
from stitchsim_service import jobs
from stitchsim_service.context import Context
from stitchsim_service.db import TERMINAL_STATES, JobRow
from stitchsim_service.deps import get_ctx, get_owner
from stitchsim_service.errors import ApiError, not_found
from stitchsim_service.report_page import render_job_page
from stitchsim_service.store import is_job_id

router = APIRouter(prefix="/jobs", tags=["jobs"])

_404 = {404: {"model": ErrorBody}}


def _job(ctx: Context, owner: str, job_id: str) -> JobRow:
    # A malformed id names no job; checked first, as the job table cannot even be asked about
    # some (PostgreSQL refuses a NUL byte).
    row = jobs.get_job(ctx, owner, job_id) if is_job_id(job_id) else None
    if row is None:
        raise not_found("job", job_id)
    return row


def _check_cursor(created: datetime, job_id: str) -> None:
    """Raise for what a hand-made cursor may hold that the job table cannot compare with: a
    naive or out-of-range time (OverflowError in UTC), a job id with a NUL byte."""
    if created.tzinfo is None or not is_job_id(job_id):
        raise ValueError("not a cursor of this service")
    created.astimezone(timezone.utc)


@router.get("", response_model=JobList, summary="Your jobs, newest first",
            responses={400: {"model": ErrorBody, "description": "a cursor this service did "
                                                               "not issue"}})
def list_jobs(
    ctx: Context = Depends(get_ctx),
    owner: str = Depends(get_owner),
    limit: int = Query(20, ge=1, le=100),
    cursor: str | None = Query(None, max_length=200, description="next_cursor of the last page"),
    state: Literal["queued", "running", "succeeded", "failed", "cancelled"] | None = None,
) -> JobList:
    decoded = None
    if cursor:
        try:
            decoded = jobs.decode_cursor(cursor)
            _check_cursor(*decoded)
        except (ValueError, OverflowError, binascii.Error, UnicodeDecodeError):
            raise ApiError(400, "bad_request", "cursor is not one this service issued") from None
    rows, nxt = jobs.list_jobs(ctx, owner, limit=limit, cursor=decoded, state=state)
    return JobList(items=[jobs.to_status(r, with_spec=False) for r in rows], next_cursor=nxt)


@router.get("/{job_id}", response_model=JobStatus, responses=_404, summary="Job status")
async def get_job(job_id: str, ctx: Context = Depends(get_ctx),
                  owner: str = Depends(get_owner)) -> JobStatus:
    # The hottest path (pollers): one thread hop for the read, the rest on the loop.
    return await to_thread.run_sync(lambda: jobs.to_status(_job(ctx, owner, job_id)))


def _report_bytes(ctx: Context, row: JobRow) -> bytes:
    if row.state != "succeeded":
        reason = f" ({row.error_message})" if row.error_message else ""
        raise ApiError(409, "job_not_finished" if row.state not in TERMINAL_STATES else
                       f"job_{row.state}",
                       f"job {row.id} is {row.state}{reason}; a report exists only once it "
                       "succeeded", {"state": row.state})
    data = ctx.store.get_bytes(row.report_key) if row.report_key else None
    if data is None:
        raise ApiError(503, "report_unavailable",
                       f"the report of job {row.id} cannot be read from the store right now",
                       headers={"Retry-After": "30"})
    return data


@router.get("/{job_id}/report", response_model=Report,
            responses={**_404, 409: {"model": ErrorBody}}, summary="The JSON report")
def get_report(job_id: str, ctx: Context = Depends(get_ctx),
               owner: str = Depends(get_owner)) -> Response:
    data = _report_bytes(ctx, _job(ctx, owner, job_id))
    return Response(content=data, media_type="application/json")


@router.get("/{job_id}/report.html", response_class=HTMLResponse, responses=_404,
            summary="The report as a page (shows progress while the job runs)")
def get_report_html(job_id: str, ctx: Context = Depends(get_ctx),
                    owner: str = Depends(get_owner)) -> HTMLResponse:
    row = _job(ctx, owner, job_id)
    status = jobs.to_status(row)
    report = None
    if row.state == "succeeded":
        report = Report.model_validate(json.loads(_report_bytes(ctx, row)))
    return HTMLResponse(render_job_page(status, report))


@router.delete("/{job_id}", response_model=JobStatus,
               responses={**_404, 409: {"model": ErrorBody},
                          202: {"model": JobStatus, "description": "running; will stop soon"}},
               summary="Cancel a job")
def cancel_job(job_id: str, response: Response, ctx: Context = Depends(get_ctx),
               owner: str = Depends(get_owner)) -> JobStatus:
    row = _job(ctx, owner, job_id)
    if row.state in TERMINAL_STATES:
        raise ApiError(409, "job_finished", f"job {job_id} already {row.state}",
                       {"state": row.state})
    row = jobs.request_cancel(ctx, owner, job_id) or row
    if row.state == "running":
        # Cooperative: the worker sees the flag between batches.
        response.status_code = 202
    return jobs.to_status(row)
