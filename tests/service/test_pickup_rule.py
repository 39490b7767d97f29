"""The reaper's rule for jobs a worker took and never started (issue 38.1), on a real job
table: failed with not_picked_up only when the job was already sent again, waited past the
pickup timeout, and its worker is alive and runs nothing; a job whose worker died or works
waits its turn."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from stitchsim_service.core import jobs, workers
from stitchsim_service.core.context import Context
from stitchsim_service.core.db import JobRow, WorkerRow, utcnow
from stitchsim_service.core.settings import Settings

PICKUP_S = 300.0


@pytest.fixture()
def ctx(tmp_path: Path) -> Context:
    return Context.open(Settings(data_dir=tmp_path, pickup_timeout_s=PICKUP_S))


def _job(ctx: Context, job_id: str, worker: str, *, state: str = "queued",
         stage: str = "requeued", waited_s: float = PICKUP_S + 30,
         delivered_s: float | None = None) -> None:
    now = utcnow()
    with ctx.db.write() as s:
        s.add(JobRow(id=job_id, owner="local", state=state, spec_json="{}", created_at=now,
                     enqueued_at=now - timedelta(seconds=waited_s),
                     delivered_at=(now - timedelta(seconds=delivered_s)
                                   if delivered_s is not None else None),
                     heartbeat_at=now if state == "running" else None,
                     attempts=1 if state == "running" else 0, cancel_requested=False,
                     stage=stage, done=0, total=0, worker=worker))


def _row(ctx: Context, job_id: str) -> JobRow:
    with ctx.db.read() as s:
        row = s.get(JobRow, job_id)
        assert row is not None
        return row


def test_only_a_job_held_by_an_alive_idle_worker_fails(ctx: Context) -> None:
    workers.announce(ctx, "gpu@idle", "gpu")
    workers.announce(ctx, "gpu@busy", "gpu")
    with ctx.db.write() as s:  # a worker that stopped announcing long ago: dead
        s.add(WorkerRow(name="gpu@dead", queues="gpu", pid=1,
                        last_seen=utcnow() - timedelta(hours=1)))
    _job(ctx, "a" * 32, "gpu@idle")
    _job(ctx, "b" * 32, "gpu@dead")
    _job(ctx, "c" * 32, "gpu@busy")
    _job(ctx, "d" * 32, "gpu@busy", state="running", stage="training")
    _job(ctx, "e" * 32, "gpu@idle", waited_s=PICKUP_S - 30)  # not waited long enough yet
    _job(ctx, "f" * 32, "gpu@idle", stage="queued", delivered_s=120)  # never sent again yet

    requeued = dict(jobs.reap(ctx))

    stuck = _row(ctx, "a" * 32)
    assert stuck.state == "failed" and stuck.error_code == "not_picked_up"
    assert "gpu@idle" in (stuck.error_message or "")
    assert json.loads(stuck.error_details or "{}")["worker"] == "gpu@idle"
    for waiting in ("b", "c", "e"):
        assert _row(ctx, waiting * 32).state == "queued", waiting
    assert _row(ctx, "d" * 32).state == "running"
    # The first time a worker sits on a job, the job is sent again, not failed.
    assert list(requeued) == ["f" * 32]
    assert _row(ctx, "f" * 32).stage == "requeued"


def test_a_job_sent_again_and_again_keeps_its_pickup_clock(ctx: Context) -> None:
    workers.announce(ctx, "gpu@idle", "gpu")
    # Sent again once, delivered again, and not started again: sent again, and the time it
    # has waited since the first re-send still counts.
    _job(ctx, "a" * 32, "gpu@idle", waited_s=100, delivered_s=90)
    before = _row(ctx, "a" * 32).enqueued_at
    assert [job for job, _ in jobs.reap(ctx)] == ["a" * 32]
    assert _row(ctx, "a" * 32).enqueued_at == before
