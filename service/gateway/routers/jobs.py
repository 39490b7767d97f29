"""GET/DELETE /jobs: status (ETag, long-poll, server-sent events), reports, cancellation.

Waiting for a job: GET /jobs/{id} answers an ETag; sent back as If-None-Match it gets 304
while the status is the same, and with ?wait=S the answer waits up to S seconds (at most
MAX_WAIT_S) for the state or progress to change. GET /jobs/{id}/events streams each change.
Both wait on the process's JobWatcher, which reads the job table once per interval for every
waiting client together.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import HTMLResponse, StreamingResponse
from stitchsim.models import ErrorBody, JobList, JobState, JobStatus, Report
from stitchsim_service.core import jobs
from stitchsim_service.core.context import Context
from stitchsim_service.core.errors import NotFoundError
from stitchsim_service.core.nowait import BUSY
from stitchsim_service.core.store import is_job_id
from stitchsim_service.gateway.deps import get_ctx, get_owner, get_watcher
from stitchsim_service.gateway.middleware import METRICS_ROUTE
from stitchsim_service.gateway.pages import render_job_page
from stitchsim_service.gateway.watch import JobGone, JobWatcher, Snapshot

router = APIRouter(prefix="/jobs", tags=["jobs"])

_404: dict[int | str, dict[str, Any]] = {404: {"model": ErrorBody}}
_JSON = "application/json"
_ROUTE = "/jobs/{job_id}"
_PREFIX = "/jobs/"
MAX_WAIT_S = 60.0
"""The longest long-poll; a longer `wait` is cut to it."""
EVENTS_KEEPALIVE_S = 15.0
_STATUS_RESPONSES: dict[int | str, dict[str, Any]] = {
    **_404,
    304: {"description": "If-None-Match names the current status (after `wait` seconds "
                         "without a change, for a long-poll); no body, the ETag again"},
}


class EventStream(StreamingResponse):
    media_type = "text/event-stream"


_JSON_ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
_EVENTS_RESPONSES: dict[int | str, dict[str, Any]] = {
    # Errors come before the stream, as JSON (a "model" would be documented as the stream's
    # media type).
    **{status: {"description": what, "content": _JSON_ERROR}
       for status, what in ((401, "Unauthorized"), (404, "Not Found"),
                            (503, "Service Unavailable"))},
    200: {"description": "one event per change of state or progress, the first with the "
                         "status now: `id:` the status's ETag, `data:` the JobStatus as JSON; "
                         f"a comment line every {EVENTS_KEEPALIVE_S:g} s without a change; "
                         "the stream ends after the event of a finished job",
          "content": {"text/event-stream": {"schema": {"type": "string"}}}},
}


@router.get("", response_model=JobList, summary="Your jobs, newest first",
            responses={400: {"model": ErrorBody, "description": "a cursor this service did "
                                                               "not issue"}})
def list_jobs(
    ctx: Context = Depends(get_ctx),
    owner: str = Depends(get_owner),
    limit: int = Query(20, ge=1, le=100),
    cursor: str | None = Query(None, description="next_cursor of the last page",
                               json_schema_extra={"pattern": jobs.CURSOR_PATTERN}),
    state: JobState | None = None,
) -> Response:
    decoded = jobs.decode_cursor(cursor) if cursor is not None else None
    rows, nxt = jobs.list_jobs(ctx, owner, limit=limit, cursor=decoded, state=state)
    return Response(jobs.list_json(rows, nxt), media_type=_JSON)


@router.get("/{job_id}", response_model=JobStatus, responses=_STATUS_RESPONSES,
            summary="Job status; with If-None-Match and wait, a long-poll")
async def get_job(
    job_id: str,
    request: Request,
    owner: str = Depends(get_owner),
    wait: float | None = Query(
        None, ge=0, allow_inf_nan=False,
        description=f"seconds to wait for the status to differ from If-None-Match (at most "
        f"{MAX_WAIT_S:g}; longer asks are cut to it): the answer comes at once when it differs "
        "or the job has ended, else at the first change of state or progress (200), else "
        "after the wait (304)"),
    if_none_match: str | None = Header(
        None, description="ETag of the status the client has: 304 while it is current"),
) -> Response:
    # The row on the loop's thread when that needs no waiting (the embedded table, nearly
    # always), else in a worker thread: the hop costs more than the read (core.nowait).
    ctx: Context = request.app.state.ctx  # not a dependency: see deps.get_owner
    row = jobs.find_job_nowait(ctx, owner, job_id)
    if row is BUSY:
        row = await to_thread.run_sync(jobs.find_job, ctx, owner, job_id)
    watcher: JobWatcher = request.app.state.watcher
    now = watcher.snapshots.of(row)
    if not if_none_match or not etag_matches(if_none_match, now.etag):
        return _status(now)
    if wait and not now.terminal:
        # A long-poll's time is mostly waiting: its own label keeps the plain polls' latency
        # readable in /metrics.
        request.scope[METRICS_ROUTE] = f"{_ROUTE}?wait"
        try:
            changed = await _wait_for_change(request, watcher, job_id, now.etag,
                                             min(wait, MAX_WAIT_S))
        except JobGone:
            raise NotFoundError("job", job_id) from None
        if changed is not None:
            return _status(changed)
    return Response(status_code=304, headers=_cache_headers(now.etag))


@router.get("/{job_id}/events", response_class=EventStream, responses=_EVENTS_RESPONSES,
            summary="Status changes as server-sent events, until the job ends")
async def job_events(
    job_id: str,
    ctx: Context = Depends(get_ctx),
    owner: str = Depends(get_owner),
    watcher: JobWatcher = Depends(get_watcher),
    last_event_id: str | None = Header(
        None, description="id of the last event received: the stream resumes after it"),
) -> EventStream:
    row = await to_thread.run_sync(jobs.find_job, ctx, owner, job_id)
    return EventStream(_events(watcher, job_id, watcher.snapshots.of(row), last_event_id),
                       headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


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



# ---------------------------------------------------------------- waiting for a job


def etag_matches(if_none_match: str, etag: str) -> bool:
    """If-None-Match's weak comparison (RFC 9110 13.1.2): any listed tag, W/ or not, or *."""
    if if_none_match.strip() == "*":
        return True
    return any(tag.strip().removeprefix("W/") == etag for tag in if_none_match.split(","))


def _cache_headers(etag: str) -> dict[str, str]:
    # Each key's own answer, to be revalidated every time: the ETag makes that cheap.
    return {"ETag": etag, "Cache-Control": "private, no-cache"}


def _status(snapshot: Snapshot) -> Response:
    return Response(snapshot.body, media_type=_JSON, headers=_cache_headers(snapshot.etag))


async def _wait_for_change(request: Request, watcher: JobWatcher, job_id: str, etag: str,
                           seconds: float) -> Snapshot | None:
    """The job's next status within seconds, else None; also None as soon as the client has
    gone (its waiter is dropped then, not held to the end of the wait)."""
    change = asyncio.ensure_future(watcher.changed(job_id, etag, seconds))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((change, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (change, gone):
            task.cancel()
        await asyncio.gather(change, gone, return_exceptions=True)
    if change.cancelled():
        return None
    return change.result()  # JobGone raises here


async def _disconnected(request: Request) -> None:
    # A GET's body is its one empty message; the next receive returns at the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _events(watcher: JobWatcher, job_id: str, now: Snapshot,
                  last_event_id: str | None) -> AsyncIterator[bytes]:
    if last_event_id != now.etag:
        yield _event(now)
    while not now.terminal:
        try:
            changed = await watcher.changed(job_id, now.etag, EVENTS_KEEPALIVE_S)
        except JobGone:
            return
        if changed is None:
            yield b": keep-alive\n\n"  # proxies close a stream that stays silent
            continue
        now = changed
        yield _event(now)


def _event(snapshot: Snapshot) -> bytes:
    data = b"".join(b"data: " + line + b"\n" for line in snapshot.body.split(b"\n"))
    return b"id: " + snapshot.etag.encode() + b"\n" + data + b"\n"


# ---------------------------------------------------------------- access log


class QuietPolls(logging.Filter):
    """On uvicorn's access logger: drops the lines of answered status polls (200 or 304 to
    GET /jobs/{id}, long-polls included) unless STITCHSIM_ACCESS_LOG_POLLS; every other line
    stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not isinstance(args, tuple) or len(args) != 5:
            return True
        _, method, path, _, status = args
        if status not in (200, 304) or method != "GET" or not isinstance(path, str):
            return True
        path = path.partition("?")[0]
        return not (len(path) == 38 and path.startswith(_PREFIX) and is_job_id(path[6:]))


QUIET_POLLS = QuietPolls()
