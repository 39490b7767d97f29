"""GET/DELETE /jobs: status, progress, reports, cancellation."""

from __future__ import annotations

import json
import logging
import sqlite3
import time

from anyio import to_thread
from fastapi import APIRouter, Depends, Query, Response
from fastapi.responses import HTMLResponse
from starlette.types import Scope, Send
from stitchsim.models import ErrorBody, JobList, JobState, JobStatus, Report
from stitchsim_service.core import jobs
from stitchsim_service.core.context import Context
from stitchsim_service.core.db import JobRow
from stitchsim_service.core.metrics import BatchedAnswers
from stitchsim_service.core.store import is_job_id
from stitchsim_service.gateway.deps import cached_owner, get_ctx, get_owner, key_from_headers
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
    # Most polls are answered by StatusPolls before they get here; this is the path for
    # the rest (a key not seen lately, a busy table, errors), with the same body. A session
    # read, which waits for a busy table where the fast path's lookup does not.
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


# ---------------------------------------------------------------- the poll fast path

log = logging.getLogger("stitchsim.service")
_PREFIX = "/jobs/"
_HEADERS = [(b"content-type", b"application/json")]


class QuietPolls(logging.Filter):
    """On uvicorn's access logger: drops the lines of answered status polls (200 to GET
    /jobs/{id}) unless STITCHSIM_ACCESS_LOG_POLLS, so a poll answered by the app or the route
    is logged as one answered by the protocol (which writes none) is; every other line stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not isinstance(args, tuple) or len(args) != 5:
            return True
        _, method, path, _, status = args
        return not (status == 200 and method == "GET" and isinstance(path, str)
                    and len(path) == 38 and path.startswith(_PREFIX) and is_job_id(path[6:]))


QUIET_POLLS = QuietPolls()


class StatusPolls:
    """GET /jobs/{id}, the request pollers repeat, answered before FastAPI's middleware,
    routing and dependency machinery (most of a poll's CPU): the owner from the key cache,
    one primary-key read of the job table (on the event loop where it cannot block: SQLite),
    the body as the route builds it, counted in the same metrics. Two callers: the gateway
    app (answer(), before its middleware) and, earlier still, the HTTP protocol
    (edge.GuardedProtocol, which answers a poll from its parsed headers without an ASGI
    request cycle). Whatever it cannot answer at once (a key not seen lately, no key where
    one is needed, a job not the caller's, a busy table, any error) goes on to the route,
    which answers as always: a shortcut for 200s, never a second set of rules.

    Nothing is cached but keys (deps._KeyCache) and, per job, the body last rendered beside
    the raw row it came from and the table's version then (Database.lookup_version, which any
    commit of any process changes): a poll reads the row again whenever the table changed
    since, and reuses the body only for the same row, so every gateway process answers from
    the same truth and a change shows on the next poll."""

    ROUTE = "/jobs/{job_id}"
    _MAX_BODIES = 4096  # jobs whose rendered body is kept; beyond it the cache starts afresh

    def __init__(self) -> None:
        self.ctx: Context | None = None  # the app's, once started
        self._answered = BatchedAnswers("GET", self.ROUTE)
        # job id -> (raw row, its owner, the body rendered from it, the table's lookup_version
        # when the row was read); read and written on the event loop only (answer_now).
        self._bodies: dict[str, tuple[tuple[object, ...], str, bytes, bytes | None]] = {}

    def count(self, start: float) -> None:
        """Count an answered poll in the route's metrics (start: its perf_counter)."""
        self._answered.add(time.perf_counter() - start)

    async def answer(self, scope: Scope, send: Send) -> bool:
        """True when the poll was answered here; False: pass it on, nothing was sent."""
        ctx = self.ctx
        path = scope["path"]
        if (len(path) != 38 or scope["method"] != "GET" or not path.startswith(_PREFIX)
                or scope.get("query_string") or ctx is None):
            return False
        start = time.perf_counter()
        client = scope.get("client")
        key = key_from_headers(scope["headers"])
        if ctx.db.nonblocking_lookups:
            body = self.answer_now(ctx, path[len(_PREFIX):], key, client[0] if client else None)
        else:
            body = await self._threaded_body(ctx, path[len(_PREFIX):], key,
                                             client[0] if client else None)
        if body is None:
            return False
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*_HEADERS, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
        self.count(start)
        return True

    def answer_now(self, ctx: Context, job_id: str, key: str | None,
                   client: str | None) -> bytes | None:
        """The body of a poll of job_id, read without waiting (SQLite: the caller checked
        ctx.db.nonblocking_lookups), or None: the route decides. On the event loop."""
        if not is_job_id(job_id):
            return None
        owner = cached_owner(ctx, key, client)
        if owner is None:
            return None
        table = JobRow.__table__
        hit = self._bodies.get(job_id)
        # Read before the row: a commit after it, even one the row read below sees, makes the
        # next poll read again.
        version = ctx.db.lookup_version()
        if hit is not None and version is not None and hit[3] == version:
            return hit[2] if hit[1] == owner else None
        try:
            raw = ctx.db.lookup_raw(table, job_id)  # type: ignore[arg-type]
            if raw is None:
                return None
            if hit is not None and hit[0] == raw:
                self._bodies[job_id] = (raw, hit[1], hit[2], version)
                return hit[2] if hit[1] == owner else None
            row = ctx.db.row_of(table, raw)  # type: ignore[arg-type]
            body = jobs.status_json(row)
        except sqlite3.OperationalError as exc:  # busy or locked: the route waits for it
            log.debug("status poll of %s goes the threaded way: %s", job_id, exc)
            return None
        except Exception:  # the route reports it (503 for a job table that is down)
            log.debug("status poll of %s goes the threaded way", job_id, exc_info=True)
            return None
        if len(self._bodies) >= self._MAX_BODIES:
            self._bodies.clear()
        self._bodies[job_id] = (raw, row.owner, body, version)
        # find_job's rule: another owner's job is not found (the route answers 404).
        return body if row.owner == owner else None

    async def _threaded_body(self, ctx: Context, job_id: str, key: str | None,
                             client: str | None) -> bytes | None:
        owner = cached_owner(ctx, key, client)
        if owner is None or not is_job_id(job_id):
            return None
        try:
            row = await to_thread.run_sync(jobs.find_job, ctx, owner, job_id)
            return jobs.status_json(row) if row is not None else None
        except Exception:  # the route reports it (503 for a job table that is down)
            log.debug("status poll of %s goes the threaded way", job_id, exc_info=True)
        return None
