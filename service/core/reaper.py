"""Background loop in the gateway: requeue jobs whose worker vanished (its heartbeat older
than STITCHSIM_STALE_AFTER_S; docs/service.md, Reliability)."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from sqlalchemy import update
from stitchsim_service.core import jobs
from stitchsim_service.core.context import Context
from stitchsim_service.core.db import JobRow, utcnow
from stitchsim_service.core.metrics import JOBS_REQUEUED

log = logging.getLogger("stitchsim.reaper")


def reap_once(ctx: Context) -> int:
    assert ctx.queue is not None
    return _send_again(ctx, jobs.reap(ctx, broker_empty=ctx.queue.depth("gpu") == 0))


def requeue_node_once(ctx: Context, node: str) -> int:
    """At a worker's start, under its node name: the jobs its previous process was running
    are requeued now, not once their heartbeat goes stale (STITCHSIM_STALE_AFTER_S) while
    jobs queued after them overtake them."""
    return _send_again(ctx, jobs.requeue_node(ctx, node))


def _send_again(ctx: Context, requeued: list[tuple[str, int]]) -> int:
    assert ctx.queue is not None
    for job_id, attempts in requeued:
        try:
            ctx.queue.enqueue(job_id, attempt_hint=attempts)
            JOBS_REQUEUED.inc()
        except Exception as exc:
            log.error("could not requeue job %s: %s; will retry", job_id, exc)
            # Look delivered-and-stale again, so the next round retries the send.
            back = utcnow() - timedelta(seconds=ctx.settings.stale_after_s + 1)
            with ctx.db.write() as s:
                s.execute(update(JobRow).where(JobRow.id == job_id, JobRow.state == "queued")
                          .values(delivered_at=back))
    return len(requeued)


class Reaper:
    def __init__(self, ctx: Context):
        self.ctx = ctx
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stitchsim-reaper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.ctx.settings.reap_interval_s):
            try:
                reap_once(self.ctx)
            except Exception:
                log.exception("reaper round failed")
