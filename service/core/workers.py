"""Which workers are alive: each announces itself in the workers table while it runs, so
readiness and metrics work without the broker's remote control (which the embedded broker
lacks)."""

from __future__ import annotations

import json
import logging
import os
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, select
from stitchsim_service.core.context import Context
from stitchsim_service.core.db import WorkerRow, utcnow

log = logging.getLogger("stitchsim.workers")


def seen_window_s(ctx: Context) -> float:
    """How recent an announcement must be for its worker to count as alive."""
    return max(30.0, 3 * ctx.settings.heartbeat_s)


def seen_by_queue(ctx: Context) -> dict[str, int]:
    """Workers seen within the window, counted per queue they consume."""
    cutoff = utcnow() - timedelta(seconds=seen_window_s(ctx))
    with ctx.db.read() as s:
        queues = s.scalars(select(WorkerRow.queues).where(WorkerRow.last_seen >= cutoff)).all()
    counts: dict[str, int] = {}
    for qs in queues:
        for q in qs.split(","):
            counts[q] = counts.get(q, 0) + 1
    return counts


def announce(ctx: Context, name: str, queues: str, calibration: str | None = None) -> None:
    with ctx.db.write() as s:
        row = s.get(WorkerRow, name)
        if row is None:
            s.add(WorkerRow(name=name, queues=queues, pid=os.getpid(), last_seen=utcnow(),
                            calibration=calibration))
        else:
            row.queues, row.pid, row.last_seen = queues, os.getpid(), utcnow()
            row.calibration = calibration


def calibrations(ctx: Context, queue: str) -> list[dict[str, Any]]:
    """The device calibrations live workers of `queue` announced (those still measuring, or
    not calibrating, announce none)."""
    cutoff = utcnow() - timedelta(seconds=seen_window_s(ctx))
    with ctx.db.read() as s:
        rows = s.execute(select(WorkerRow.queues, WorkerRow.calibration)
                         .where(WorkerRow.last_seen >= cutoff)).all()
    found = []
    for queues, text in rows:
        if text and queue in queues.split(","):
            try:
                found.append(json.loads(text))
            except ValueError:
                log.warning("a worker announced an unreadable calibration: %.200s", text)
    return found


def forget(ctx: Context, name: str) -> None:
    with ctx.db.write() as s:
        s.execute(delete(WorkerRow).where(WorkerRow.name == name))
