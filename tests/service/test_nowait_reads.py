"""The status poll's read on the event loop (core.nowait): the same row as the threaded read,
column for column and type for type, and BUSY at once, never a wait, when SQLite is locked.

On a real SQLite job table in WAL mode, as the embedded service keeps it."""

from __future__ import annotations

import sqlite3
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session
from stitchsim_service.core import jobs
from stitchsim_service.core.context import Context
from stitchsim_service.core.db import ApiKeyRow, Base, JobRow, get_database
from stitchsim_service.core.errors import NotFoundError
from stitchsim_service.core.keys import create_key, hash_key
from stitchsim_service.core.nowait import BUSY, NoWaitReads
from stitchsim_service.core.settings import Settings


@pytest.fixture()
def ctx(tmp_path: Path) -> Context:
    return Context.open(Settings(data_dir=tmp_path))


def _jobs(ctx: Context) -> tuple[str, JobRow, JobRow]:
    """An owner, a queued job with most columns empty, and a failed one with every column set
    (the types the reader must convert: aware datetimes, a boolean, floats, big integers)."""
    owner = "k_" + "1" * 16
    t = datetime(2026, 12, 3, 18, 30, 1, 123456, tzinfo=timezone.utc)
    queued = JobRow(id="a" * 32, owner=owner, state="queued", spec_json='{"x": 1}',
                    created_at=t, attempts=0, stage="queued", done=0, total=0)
    failed = JobRow(id="b" * 32, owner=owner, state="failed", spec_json='{"y": 2}',
                    created_at=t, enqueued_at=t, delivered_at=t, started_at=t,
                    finished_at=t, heartbeat_at=t, duration_s=12.5, attempts=2,
                    cancel_requested=True, worker="gpu@host", stage="training", done=7,
                    total=9, eta_s=3.25, error_code="out_of_memory", error_message="too big",
                    error_details='{"need_bytes": 1}', report_key=None, idempotency_key="i",
                    request_hash="h", est_units=2**40, est_seconds=1.5)
    with ctx.db.write() as s:
        s.add_all([queued, failed])
    return owner, queued, failed


def test_rows_equal_the_threaded_read(ctx: Context) -> None:
    owner, *rows = _jobs(ctx)
    table = JobRow.__table__
    for row in rows:
        threaded = ctx.db.lookup(table, row.id)  # type: ignore[arg-type]
        nowait = jobs.find_job_nowait(ctx, owner, row.id)
        assert nowait is not BUSY
        assert tuple(nowait) == tuple(threaded)
        assert [type(v) for v in nowait] == [type(v) for v in threaded]
        assert nowait.created_at.tzinfo is not None and nowait.created_at == row.created_at
        assert jobs.status_json(nowait) == jobs.status_json(threaded)
    assert jobs.find_job_nowait(ctx, owner, rows[1].id).cancel_requested is True
    # Another owner's job, a job that is not there, an id that is not one: not_found, as the
    # threaded read says.
    for owner_, job_id in ((owner[:-1] + "2", rows[0].id), (owner, "c" * 32), (owner, "x\0")):
        with pytest.raises(NotFoundError):
            jobs.find_job_nowait(ctx, owner_, job_id)
        with pytest.raises(NotFoundError):
            jobs.find_job(ctx, owner_, job_id)
    # By a unique column: the API keys' hashes.
    key = create_key(ctx.db, "k")
    keys = ApiKeyRow.__table__
    assert tuple(ctx.db.nowait.lookup(keys, hash_key(key.key), by="key_hash")) == \
        tuple(ctx.db.lookup(keys, hash_key(key.key), by="key_hash"))  # type: ignore[arg-type]


def test_a_locked_table_is_busy_at_once_then_read_again(tmp_path: Path) -> None:
    # A rollback-journal table, where a writer's exclusive lock keeps readers out (in the
    # service's WAL mode readers pass writers, so a lock is rarer, but handled the same).
    url = f"sqlite:///{tmp_path / 'rollback.db'}"
    engine = create_engine(url)
    Base.metadata.create_all(engine)
    with Session(engine) as s, s.begin():
        s.add(JobRow(id="a" * 32, owner="o", state="queued", spec_json="{}", attempts=0,
                     created_at=datetime(2026, 12, 3, tzinfo=timezone.utc), stage="queued",
                     done=0, total=0))
    reads = NoWaitReads(url, engine.dialect)
    table = JobRow.__table__
    assert reads.lookup(table, "a" * 32).state == "queued"  # type: ignore[arg-type]
    locker = sqlite3.connect(tmp_path / "rollback.db", isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    locker.execute("UPDATE jobs SET state = 'running' WHERE id = ?", ("a" * 32,))
    try:
        t0 = time.monotonic()
        assert reads.lookup(table, "a" * 32) is BUSY  # type: ignore[arg-type]
        assert time.monotonic() - t0 < 1.0  # no busy timeout (the threaded read's is 30 s)
    finally:
        locker.execute("COMMIT")
        locker.close()
    assert reads.lookup(table, "a" * 32).state == "running"  # type: ignore[arg-type]
    # A file that is no database: BUSY as well, and the threaded read reports the error.
    (tmp_path / "junk.db").write_bytes(b"not a database" * 100)
    junk = NoWaitReads(f"sqlite:///{tmp_path / 'junk.db'}", engine.dialect)
    assert junk.lookup(table, "a" * 32) is BUSY  # type: ignore[arg-type]
    engine.dispose()


@pytest.mark.parametrize("url", ["postgresql://u@127.0.0.1:5432/x", "sqlite://",
                                 "sqlite:///:memory:"])
def test_other_databases_are_always_read_in_a_thread(url: str) -> None:
    db = get_database("sqlite://")
    reads = NoWaitReads(url, db.engine.dialect)
    assert reads.lookup(JobRow.__table__, "a" * 32) is BUSY  # type: ignore[arg-type]

