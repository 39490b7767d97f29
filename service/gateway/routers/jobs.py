"""GET/DELETE /jobs: status, progress, reports, cancellation."""

from __future__ import annotations

import json

from anyio import to_thread
from fastapi import APIRouter, Depends, Query, Response
from fastapi.responses import HTMLResponse
from stitchsim.models import ErrorBody, JobList, JobState, JobStatus, Report
from stitchsim_service.core import jobs
from stitchsim_service.core.context import Context
from stitchsim_service.gateway.deps import get_ctx, get_owner
from stitchsim_service.gateway.pages import render_job_page

router = APIRouter(prefix="/jobs", tags=["jobs"])

_404 = {404: {"model": ErrorBody}}
_JSON = "application/json"


@router.get("", response_model=JobList, summary="Your jobs, newest first",
            responses={400: {"model": ErrorBody, "description": "a cursor this service did "
                                                               "not issue"}})
def list_jobs(
    ctx: Context = Depends(get_ctx),
    owner: str = Depends(get_owner),
    limit: int = Query(20, ge=1, le=100),
    cursor: str | None = Query(None, max_length=200, description="next_cursor of the last page"),
    state: JobState | None = None,
) -> Response:
    decoded = jobs.decode_cursor(cursor) if cursor else None
    rows, nxt = jobs.list_jobs(ctx, owner, limit=limit, cursor=decoded, state=state)
    return Response(jobs.list_json(rows, nxt), media_type=_JSON)


@router.get("/{job_id}", response_model=JobStatus, responses=_404, summary="Job status")
async def get_job(job_id: str, ctx: Context = Depends(get_ctx),
                  owner: str = Depends(get_owner)) -> Response:
    # The hottest path (pollers): one thread hop for the read, the rest on the loop; the
    # stored spec goes out as stored, neither parsed nor validated again.
    row = await to_thread.run_sync(jobs.get_job, ctx, owner, job_id)
    return Response(jobs.status_json(row), media_type=_JSON)


@router.get("/{job_id}/report", response_model=Report,
            responses={**_404, 409: {"model": ErrorBody}}, summary="The JSON report")
def get_report(job_id: str, ctx: Context = Depends(get_ctx),
               owner: str = Depends(get_owner)) -> Response:
    data = jobs.report_bytes(ctx, jobs.get_job(ctx, owner, job_id))
    return Response(content=data, media_type=_JSON)


@router.get("/{job_id}/report.html", response_class=HTMLResponse, responses=_404,
            summary="The report as a page (shows progress while the job runs)")
def get_report_html(job_id: str, ctx: Context = Depends(get_ctx),
                    owner: str = Depends(get_owner)) -> HTMLResponse:
    row = jobs.get_job(ctx, owner, job_id)
    report = None
    if row.state == "succeeded":
        report = Report.model_validate(json.loads(jobs.report_bytes(ctx, row)))
    return HTMLResponse(render_job_page(jobs.to_status(row, with_spec=report is None), report))


@router.delete("/{job_id}", response_model=JobStatus,
               responses={**_404, 409: {"model": ErrorBody},
                          202: {"model": JobStatus, "description": "running; will stop soon"}},
               summary="Cancel a job")
def cancel_job(job_id: str, ctx: Context = Depends(get_ctx),
               owner: str = Depends(get_owner)) -> Response:
    row = jobs.cancel(ctx, owner, job_id)
    # Running: cooperative, the worker sees the flag between batches.
    return Response(jobs.status_json(row), media_type=_JSON,
                    status_code=202 if row.state == "running" else 200)
