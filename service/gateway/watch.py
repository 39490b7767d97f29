"""One watcher per gateway process for the jobs its clients wait on (long-polls, event streams).

A waiting client registers the job and the ETag of the status it has; the watcher reads the rows
of every watched job in one query each STITCHSIM_JOB_WATCH_INTERVAL_S and wakes the waiters
whose job now shows another status. No waiter holds a database connection or reads the table:
one query per interval per process, whatever the number of waiters, and none while nobody
waits. The job table stays the only truth: each gateway process runs its own watcher, so a
change made through any process, or by a worker, reaches the waiters of every process.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from stitchsim.models import TERMINAL_STATES
from stitchsim_service.core import jobs
from stitchsim_service.core.context import Context
from stitchsim_service.core.metrics import JOB_WAITERS, JOB_WATCH_READS

log = logging.getLogger("stitchsim.service")


@dataclass(frozen=True)
class Snapshot:
    """A job's status as the route sends it."""

    body: bytes
    etag: str
    terminal: bool

    @classmethod
    def of(cls, row: Any) -> Snapshot:
        body = jobs.status_json(row)
        return cls(body, jobs.status_etag(body), row.state in TERMINAL_STATES)


class Snapshots:
    """The snapshot last rendered per job, with the row it was rendered from: a status read
    again with every column as before (many clients polling one job, polls between two
    heartbeats) is answered with the same bytes, without building its JobStatus again. One
    per gateway process, shared by the status route and the watcher; a row with any column
    changed is rendered anew, so nothing here can be stale."""

    MAX_JOBS = 2000
    """Jobs kept at most (a few KB each): beyond, the cache starts again empty."""

    def __init__(self) -> None:
        self._items: dict[str, tuple[tuple[Any, ...], Snapshot]] = {}

    def of(self, row: Any) -> Snapshot:
        raw = tuple(row)
        seen = self._items.get(row.id)
        if seen is not None and seen[0] == raw:
            return seen[1]
        snapshot = Snapshot.of(row)
        if len(self._items) >= self.MAX_JOBS:
            self._items.clear()
        self._items[row.id] = (raw, snapshot)
        return snapshot


class JobGone(Exception):
    """The watched job's row is no longer in the table."""


@dataclass
class _Waiter:
    etag: str
    future: asyncio.Future[Snapshot]


class JobWatcher:
    """Wakes the clients waiting on jobs when their status changes (see the module)."""

    def __init__(self, ctx: Context, interval_s: float) -> None:
        self.ctx = ctx
        self.interval_s = interval_s
        self._waiters: dict[str, list[_Waiter]] = {}
        self.snapshots = Snapshots()
        self._task: asyncio.Task[None] | None = None

    async def changed(self, job_id: str, etag: str, timeout: float) -> Snapshot | None:
        """The job's status once its ETag is no longer etag; None after timeout seconds
        without a change. JobGone when its row disappears meanwhile."""
        future: asyncio.Future[Snapshot] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(etag, future)
        self._waiters.setdefault(job_id, []).append(waiter)
        JOB_WAITERS.inc()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="stitchsim-job-watcher")
        try:
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:  # not the builtin before Python 3.11
            return None
        finally:
            JOB_WAITERS.dec()
            self._forget(job_id, waiter)

    def _forget(self, job_id: str, waiter: _Waiter) -> None:
        waiters = self._waiters.get(job_id)
        if waiters is None:
            return
        if waiter in waiters:
            waiters.remove(waiter)
        if not waiters:
            del self._waiters[job_id]

    async def _run(self) -> None:
        # Ends when nobody waits; the next waiter starts it again. Nothing awaits between the
        # emptiness check and clearing _task, so no waiter is left without a watcher.
        try:
            while self._waiters:
                await asyncio.sleep(self.interval_s)
                if self._waiters:
                    await self._read_once()
        finally:
            self._task = None

    async def _read_once(self) -> None:
        ids = list(self._waiters)
        try:
            rows = await asyncio.to_thread(jobs.rows_of, self.ctx, ids)
        except Exception as exc:  # the table is busy or down: waiters time out, or next time
            log.warning("job watcher could not read the job table: %s", exc)
            return
        JOB_WATCH_READS.inc()
        for job_id in ids:
            waiters = self._waiters.get(job_id)
            if not waiters:
                continue
            row = rows.get(job_id)
            if row is None:
                for w in list(waiters):
                    if not w.future.done():
                        w.future.set_exception(JobGone(job_id))
                continue
            snapshot = self.snapshots.of(row)
            for w in list(waiters):
                if w.etag != snapshot.etag and not w.future.done():
                    w.future.set_result(snapshot)
