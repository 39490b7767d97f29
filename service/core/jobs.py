"""Job lifecycle in the job table: every state change of a job happens in this module.

queued ──claim──▶ running ──finish──▶ succeeded | failed | cancelled
   ▲                 │
   └──── reap ───────┘  (heartbeat stale: the worker died; attempts count towards the cap)
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import and_, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from stitchsim.failure import Failure
from stitchsim.models import (
    TERMINAL_STATES,
    ErrorInfo,
    Estimate,
    JobList,
    JobState,
    JobStatus,
    Progress,
    Spec,
)
from stitchsim_service.core import quotas
from stitchsim_service.core.context import Context
from stitchsim_service.core.db import JobRow, utcnow
from stitchsim_service.core.errors import NotFoundError
from stitchsim_service.core.nowait import BUSY
from stitchsim_service.core.settings import Settings
from stitchsim_service.core.store import is_job_id

log = logging.getLogger("stitchsim.jobs")


def new_job_id() -> str:
    return uuid.uuid4().hex


def to_status(row: JobRow, *, with_spec: bool = False) -> JobStatus:
    """The row as the contract's JobStatus; the spec is parsed only when asked for (the page
    shows it), since the stored spec is the one validated at submission."""
    error = None
    if row.error_code:
        details = json.loads(row.error_details) if row.error_details else None
        error = ErrorInfo(code=row.error_code, message=row.error_message or "", details=details)
    return JobStatus(
        id=row.id,
        state=row.state,  # type: ignore[arg-type]
        progress=Progress(stage=row.stage, done=row.done, total=row.total, eta_s=row.eta_s),
        estimate=(Estimate(units=row.est_units, seconds=row.est_seconds)
                  if row.est_units is not None else None),
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        attempts=row.attempts,
        error=error,
        spec=Spec.model_validate_json(row.spec_json) if with_spec else None,
        report_url=f"/jobs/{row.id}/report" if row.state == "succeeded" else None,
    )


def status_json(row: JobRow) -> bytes:
    """GET /jobs/{id}: the JobStatus as JSON, its spec spliced in as stored. The stored spec is
    the validated one, with every default filled in: a poll neither parses nor validates it."""
    head = to_status(row).model_dump_json(exclude={"spec"})
    return f'{head[:-1]},"spec":{row.spec_json}}}'.encode()


def status_etag(body: bytes) -> str:
    """The strong ETag of a status body: its digest, so every gateway process gives the same
    tag for the same status without keeping anything, and a heartbeat that changes nothing
    shown changes no tag."""
    return f'"{hashlib.blake2b(body, digest_size=16).hexdigest()}"'


def list_json(rows: list[JobRow], next_cursor: str | None) -> bytes:
    """GET /jobs: a page of JobStatus without specs."""
    return JobList(items=[to_status(r) for r in rows], next_cursor=next_cursor
                   ).model_dump_json().encode()


# ---------------------------------------------------------------- gateway side


def find_idempotent(ctx: Context, owner: str, key: str) -> JobRow | None:
    with ctx.db.read() as s:
        return s.scalar(select(JobRow).where(JobRow.owner == owner,
                                             JobRow.idempotency_key == key))


def check_job_slot(ctx: Context, owner: str) -> None:
    """too_many_jobs early, before any upload is stored; insert_job checks again, atomically."""
    with ctx.db.read() as s:
        quotas.check_job_slot(s, ctx.settings, owner)


def insert_job(ctx: Context, owner: str, spec_json: str, *, idempotency_key: str | None,
               request_hash: str, grants: list[dict[str, Any]],
               estimate: Estimate | None = None) -> tuple[JobRow, bool]:
    """Insert a queued job (and the owner's grants to its objects) in one transaction, within
    the owner's quotas (too_many_jobs / compute_quota_exceeded / quota_exceeded otherwise).

    Returns (row, created); created is False when a concurrent request with the same
    idempotency key won the race.
    """
    from stitchsim_service.core.objects import grant_existing

    now = utcnow()
    row = JobRow(id=new_job_id(), owner=owner, state="queued", spec_json=spec_json,
                 created_at=now, enqueued_at=now, attempts=0, cancel_requested=False,
                 stage="queued", done=0, total=0, idempotency_key=idempotency_key,
                 request_hash=request_hash,
                 est_units=estimate.units if estimate else None,
                 est_seconds=estimate.seconds if estimate else None)
    try:
        with ctx.db.write() as s:
            quotas.lock_owner(s, owner)
            quotas.check_job_slot(s, ctx.settings, owner)
            if estimate is not None:
                quotas.check_compute(s, ctx.settings, owner, estimate.units)
            s.add(row)
            for g in grants:
                grant_existing(s, ctx.settings, owner, **g)
    except IntegrityError:
        if idempotency_key is None:
            raise
        existing = find_idempotent(ctx, owner, idempotency_key)
        if existing is None:
            raise
        return existing, False
    return row, True


def delete_job(ctx: Context, job_id: str) -> None:
    with ctx.db.write() as s:
        row = s.get(JobRow, job_id)
        if row is not None:
            s.delete(row)


def get_job(ctx: Context, owner: str, job_id: str) -> JobRow:
    """Owner's job; not_found when there is none (or it is another key's)."""
    # A malformed id names no job; checked first, as the job table cannot even be asked about
    # some (PostgreSQL refuses a NUL byte).
    row = None
    if is_job_id(job_id):
        with ctx.db.read() as s:
            row = s.get(JobRow, job_id)
    if row is None or row.owner != owner:
        raise NotFoundError("job", job_id)
    return row


def rows_of(ctx: Context, job_ids: list[str]) -> dict[str, Any]:
    """The rows of those of job_ids that exist, by id, in one read per 500 ids: light rows
    with JobRow's columns as attributes (status_json takes them). For the gateway's watcher of
    waiting clients, which asks for every job waited on at once."""
    table = JobRow.__table__
    found: dict[str, Any] = {}
    with ctx.db.read() as s:
        for i in range(0, len(job_ids), 500):
            chunk = job_ids[i:i + 500]
            for row in s.execute(select(table).where(table.c.id.in_(chunk))):  # type: ignore[attr-defined]
                found[row.id] = row
    return found


def find_job(ctx: Context, owner: str, job_id: str) -> Any:
    """get_job for reads that only look (status polls): a light row with JobRow's columns as
    attributes (a Core read: no ORM session, about half the cost), not_found as get_job."""
    row = ctx.db.lookup(JobRow.__table__, job_id) if is_job_id(job_id) else None  # type: ignore[arg-type]
    return _owned(row, owner, job_id)


def find_job_nowait(ctx: Context, owner: str, job_id: str) -> Any:
    """find_job on the caller's thread (an event loop's) without waiting for anything: the row,
    not_found, or BUSY (from core.nowait), and then the caller runs find_job in a thread."""
    if not is_job_id(job_id):
        raise NotFoundError("job", job_id)
    row = ctx.db.nowait.lookup(JobRow.__table__, job_id)  # type: ignore[arg-type]
    return row if row is BUSY else _owned(row, owner, job_id)


def _owned(row: Any, owner: str, job_id: str) -> Any:
    if row is None or row.owner != owner:
        raise NotFoundError("job", job_id)
    return row


def report_bytes(ctx: Context, row: JobRow) -> bytes:
    """The stored report of a succeeded job, as the worker wrote it."""
    if row.state != "succeeded":
        reason = f" ({row.error_message})" if row.error_message else ""
        raise Failure(
            "job_not_finished" if row.state not in TERMINAL_STATES else f"job_{row.state}",
            f"job {row.id} is {row.state}{reason}; a report exists only once it succeeded",
            {"state": row.state})
    data = ctx.store.get_bytes(row.report_key) if row.report_key else None
    if data is None:
        raise Failure("report_unavailable",
                      f"the report of job {row.id} cannot be read from the store right now",
                      retry_after=30)
    return data


CURSOR_PATTERN = r"^[0-9]{1,17}-[0-9a-f]{32}$"
"""A page cursor: the last job's creation time (microseconds since 1970 UTC) and its id. Every
string of this shape is a cursor the job table can compare with (17 digits stay below the year
9999), so the OpenAPI document's pattern is the whole rule."""
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)


def _encode_cursor(row: JobRow) -> str:
    return f"{(row.created_at - _EPOCH) // _MICROSECOND}-{row.id}"


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The (created_at, id) a next_cursor holds; bad_request for anything not of its shape."""
    if re.fullmatch(CURSOR_PATTERN, cursor) is None:
        raise Failure("bad_request", "cursor is not one this service issued")
    micros, job_id = cursor.split("-")
    return _EPOCH + int(micros) * _MICROSECOND, job_id


def list_jobs(ctx: Context, owner: str, *, limit: int, cursor: tuple[datetime, str] | None,
              state: str | None) -> tuple[list[JobRow], str | None]:
    q = select(JobRow).where(JobRow.owner == owner)
    if state:
        q = q.where(JobRow.state == state)
    if cursor:
        created, job_id = cursor
        q = q.where(or_(JobRow.created_at < created,
                        and_(JobRow.created_at == created, JobRow.id < job_id)))
    q = q.order_by(JobRow.created_at.desc(), JobRow.id.desc()).limit(limit + 1)
    with ctx.db.read() as s:
        rows = list(s.scalars(q))
    nxt = _encode_cursor(rows[limit - 1]) if len(rows) > limit else None
    return rows[:limit], nxt


def cancel(ctx: Context, owner: str, job_id: str) -> JobRow:
    """Cancel a queued job at once; flag a running one for the worker to stop (cooperative:
    it sees the flag between batches). job_finished when it already ended."""
    now = utcnow()
    with ctx.db.write() as s:
        row = s.get(JobRow, job_id) if is_job_id(job_id) else None
        if row is None or row.owner != owner:
            raise NotFoundError("job", job_id)
        if row.state in TERMINAL_STATES:
            raise Failure("job_finished", f"job {job_id} already {row.state}",
                          {"state": row.state})
        if row.state == "queued":
            row.state = "cancelled"
            row.finished_at = now
            row.stage = "cancelled"
        row.cancel_requested = True
        return row


# ---------------------------------------------------------------- worker side


@dataclass
class Claim:
    job_id: str
    attempt: int
    spec_json: str


class Busy(Exception):
    """Another live worker runs this job (its heartbeat is fresh)."""


def mark_delivered(ctx: Context, job_id: str, worker: str) -> None:
    with ctx.db.write() as s:
        s.execute(update(JobRow).where(JobRow.id == job_id, JobRow.state == "queued")
                  .values(delivered_at=utcnow(), worker=worker))


def claim(ctx: Context, job_id: str, worker: str) -> Claim | None:
    """Take a job for this attempt; None when there is nothing to run.

    Raises Busy when the job is running with a fresh heartbeat: either a duplicate delivery,
    or the previous attempt died a moment ago and the caller should wait and try again.
    """
    s_ = ctx.settings
    now = utcnow()
    with ctx.db.write() as s:
        row = s.get(JobRow, job_id)
        if row is None or row.state in TERMINAL_STATES:
            return None
        if row.cancel_requested:
            _finish_row(row, "cancelled", now)
            row.stage = "cancelled"
            return None
        if row.state == "running" and row.heartbeat_at is not None and (
            now - row.heartbeat_at < timedelta(seconds=2 * s_.heartbeat_s + 1)
        ):
            raise Busy(job_id)
        if row.attempts >= s_.max_attempts:
            _fail_row(row, Failure(
                "attempts_exhausted",
                f"gave up after {row.attempts} attempts: the worker running this job died each "
                "time (out of memory? a GPU fault?); try fewer stitch points, a smaller batch "
                "size or a smaller model"), now)
            return None
        row.attempts += 1
        row.state = "running"
        row.started_at = row.started_at or now
        row.heartbeat_at = now
        row.worker = worker
        row.stage = "starting"
        row.done, row.total, row.eta_s = 0, 0, None
        return Claim(job_id=row.id, attempt=row.attempts, spec_json=row.spec_json)


def _mine(job_id: str, attempt: int) -> Any:
    return and_(JobRow.id == job_id, JobRow.state == "running", JobRow.attempts == attempt)


def heartbeat(ctx: Context, c: Claim, progress: Progress | None) -> bool:
    """Refresh the heartbeat (and progress); returns the cancel flag."""
    values: dict[str, Any] = {"heartbeat_at": utcnow()}
    if progress is not None:
        values.update(stage=progress.stage[:64], done=progress.done, total=progress.total,
                      eta_s=progress.eta_s)
    with ctx.db.write() as s:
        s.execute(update(JobRow).where(_mine(c.job_id, c.attempt)).values(**values))
        flag = s.scalar(select(JobRow.cancel_requested).where(JobRow.id == c.job_id))
    return bool(flag)


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended: a terminal state, with the report's key or the Failure."""

    state: JobState
    report_key: str | None = None
    failure: Failure | None = None

    @classmethod
    def succeeded(cls, report_key: str) -> Outcome:
        return cls("succeeded", report_key=report_key)

    @classmethod
    def failed(cls, failure: Failure) -> Outcome:
        return cls("failed", failure=failure)


CANCELLED = Outcome("cancelled")


def _finish_row(row: JobRow, state: JobState, now: datetime) -> None:
    row.state = state
    row.finished_at = now
    if row.started_at is not None:
        row.duration_s = (now - row.started_at).total_seconds()


def _fail_row(row: JobRow, failure: Failure, now: datetime) -> None:
    _finish_row(row, "failed", now)
    row.stage = "failed"
    _record(row, failure)


def _record(row: JobRow, failure: Failure | None) -> None:
    row.error_code = failure.code if failure else None
    row.error_message = failure.message if failure else None
    details = failure.details if failure else None
    row.error_details = json.dumps(details) if details is not None else None


def finish(ctx: Context, c: Claim, outcome: Outcome) -> bool:
    """Record the outcome of this attempt; False when the job was taken from us meanwhile."""
    now = utcnow()
    with ctx.db.write() as s:
        row = s.get(JobRow, c.job_id)
        if row is None or row.state != "running" or row.attempts != c.attempt:
            return False
        _finish_row(row, outcome.state, now)
        row.stage = "done" if outcome.state == "succeeded" else outcome.state
        if outcome.state == "succeeded":
            row.done = row.total
            row.eta_s = 0.0
        row.report_key = outcome.report_key
        _record(row, outcome.failure)
        return True


# ---------------------------------------------------------------- reaper


def reap(ctx: Context, *, broker_empty: bool = False) -> list[tuple[str, int]]:
    """Put jobs whose worker vanished back in the queue state; returns (job_id, attempts).

    The caller re-sends them to the broker. Running jobs with a stale heartbeat lost their
    worker; queued jobs delivered long ago and never claimed lost theirs before it started.
    When the broker's queue is empty, queued jobs never delivered lost their message (a broker
    restarted without persistence) and are re-sent too.
    """
    s_ = ctx.settings
    cutoff = utcnow() - timedelta(seconds=s_.stale_after_s)
    lost = [
        and_(JobRow.state == "running", JobRow.heartbeat_at < cutoff),
        and_(JobRow.state == "queued", JobRow.delivered_at < cutoff),
    ]
    if broker_empty:
        lost.append(and_(JobRow.state == "queued", JobRow.delivered_at.is_(None),
                         JobRow.enqueued_at < cutoff))
    with ctx.db.write() as s:
        q = select(JobRow).where(or_(*lost)).limit(100)
        if not ctx.db.is_sqlite:
            q = q.with_for_update(skip_locked=True)  # several gateways reap in turn
        rows = list(s.scalars(q))
        now = utcnow()
        _fail_not_picked_up(ctx, s, now)
        out = _requeue_lost(rows, s_, now)
    return out


def requeue_node(ctx: Context, node: str) -> list[tuple[str, int]]:
    """Put back in the queue state, at once, the jobs a worker node was running when its
    previous process died (`serve` killed): the caller holds the node's name (no other live
    process has it), so they are lost for sure, with no heartbeat to wait out. Returns
    (job_id, attempts) for the caller to send again, as reap does."""
    with ctx.db.write() as s:
        rows = list(s.scalars(select(JobRow).where(JobRow.state == "running",
                                                    JobRow.worker == node).limit(100)))
        return _requeue_lost(rows, ctx.settings, utcnow())


def _requeue_lost(rows: list[JobRow], s_: Settings, now: datetime) -> list[tuple[str, int]]:
    """Lost jobs back to queued (stage requeued), cancelled or failed (attempts spent)."""
    out: list[tuple[str, int]] = []
    for row in rows:
        if row.state == "failed":  # not picked up, just now
            continue
        if row.cancel_requested:
            _finish_row(row, "cancelled", now)
            row.stage = "cancelled"
            continue
        if row.attempts >= s_.max_attempts and row.state == "running":
            _fail_row(row, Failure(
                "attempts_exhausted",
                f"gave up after {row.attempts} attempts: the worker stopped responding "
                "each time (killed, out of memory, or the machine went away)"), now)
            continue
        log.warning("requeueing job %s (state %s, attempts %s)", row.id, row.state,
                    row.attempts)
        if not (row.state == "queued" and row.stage == "requeued"):
            # Sent again and again without being started: the pickup clock keeps running
            # from the first time (_fail_not_picked_up).
            row.enqueued_at = now
        row.state = "queued"
        row.stage = "requeued"
        row.delivered_at = None
        row.heartbeat_at = None
        out.append((row.id, row.attempts))
    return out


def _fail_not_picked_up(ctx: Context, s: Session, now: datetime) -> None:
    """Fail, with the reason, queued jobs that a worker took and never started, which were
    sent again and still not started within pickup_timeout_s while that worker is alive and
    runs nothing. Such a worker holds the job's first delivery and takes no other: without
    this the job would wait in silence for as long as the worker lives."""
    from stitchsim_service.core.db import WorkerRow
    from stitchsim_service.core.workers import seen_window_s

    s_ = ctx.settings
    waited = now - timedelta(seconds=s_.pickup_timeout_s)
    candidates = list(s.scalars(select(JobRow).where(
        JobRow.state == "queued", JobRow.stage == "requeued", JobRow.worker.is_not(None),
        JobRow.enqueued_at < waited).limit(100)))
    if not candidates:
        return
    seen = now - timedelta(seconds=seen_window_s(ctx))
    alive = set(s.scalars(select(WorkerRow.name).where(WorkerRow.last_seen >= seen)))
    busy = set(s.scalars(select(JobRow.worker).where(JobRow.state == "running")))
    for row in candidates:
        if row.worker not in alive or row.worker in busy:
            continue  # a worker that died or works: the job waits its turn, as it should
        seconds = (now - row.enqueued_at).total_seconds() if row.enqueued_at else 0.0
        log.error("job %s: worker %s took it and has not started it %.0f s after it was sent "
                  "again, while it runs nothing: the worker looks stuck (restart it); failing "
                  "the job with not_picked_up", row.id, row.worker, seconds)
        _fail_row(row, Failure(
            "not_picked_up",
            f"the job was not started: worker {row.worker} took it and had not started it "
            f"{seconds:.0f} s after it was sent again, while that worker ran nothing (a stuck "
            "worker; the service's log names it). Nothing of the job ran: submit it again; "
            "if this repeats, the operator should restart the service's workers",
            {"worker": row.worker, "waited_s": round(seconds)}), now)
