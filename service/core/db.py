"""The job table and its neighbours (SQLAlchemy 2; SQLite by default, PostgreSQL by URL).

The job table is the source of truth about jobs: Celery carries work, not state.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    bindparam,
    create_engine,
    event,
    select,
    text,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker
from sqlalchemy.types import TypeDecorator
from stitchsim_service.core.nowait import NoWaitReads


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes on every backend (SQLite keeps no zone)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc)


class Base(DeclarativeBase):
    pass


class JobRow(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16), index=True)
    spec_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    enqueued_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    duration_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    worker: Mapped[str | None] = mapped_column(String(255), nullable=True)
    stage: Mapped[str] = mapped_column(String(64), default="queued")
    done: Mapped[int] = mapped_column(Integer, default=0)
    total: Mapped[int] = mapped_column(Integer, default=0)
    eta_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    error_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error_message: Mapped[str | None] = mapped_column(Text, nullable=True)
    error_details: Mapped[str | None] = mapped_column(Text, nullable=True)
    report_key: Mapped[str | None] = mapped_column(String(255), nullable=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(255), nullable=True)
    request_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    est_units: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    est_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)

    __table_args__ = (
        UniqueConstraint("owner", "idempotency_key", name="uq_jobs_owner_idem"),
        Index("ix_jobs_owner_created", "owner", "created_at", "id"),
    )


class ObjectRow(Base):
    """A stored checkpoint or dataset: what its header said, once validated."""

    __tablename__ = "objects"

    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    id: Mapped[str] = mapped_column(String(80), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    info_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class OwnershipRow(Base):
    """Which key may use which object: content is shared on disk, visibility is per key."""

    __tablename__ = "ownership"

    owner: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    object_id: Mapped[str] = mapped_column(String(80), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class KeyLimitsRow(Base):
    """A key's own quotas, where an operator set them; unset fields fall back to settings."""

    __tablename__ = "key_limits"

    owner: Mapped[str] = mapped_column(String(64), primary_key=True)
    max_active_jobs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_stored_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    max_active_units: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class ApiKeyRow(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class WorkerRow(Base):
    """Workers announce themselves here, so /readyz works without broker remote control."""

    __tablename__ = "workers"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    queues: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime())
    calibration: Mapped[str | None] = mapped_column(Text, nullable=True)
    """A job worker's device calibration as JSON (stitchsim_worker.calibration), once
    measured; the spec check prices jobs with it."""


class PendingCheckRow(Base):
    """A spec check waiting for its answer. Kept in the job table, not in a gateway process,
    so the per-key cap on pending checks holds across gateway processes; a row outlives its
    check's timeout only when its gateway died, and then expires."""

    __tablename__ = "pending_checks"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64), index=True)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())


class Database:
    """An engine plus two session factories: plain reads, and writes that lock up front.

    SQLite's deferred transactions fail with "database is locked" when a reader turns into a
    writer after another process wrote; BEGIN IMMEDIATE takes the write lock first and waits
    (busy_timeout) instead.
    """

    def __init__(self, url: str):
        self.url = url
        parsed = make_url(url)
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        kwargs: dict[str, Any] = {"pool_pre_ping": not self.is_sqlite}
        if self.is_sqlite:
            if parsed.database and parsed.database != ":memory:":
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            kwargs["connect_args"] = {"timeout": 30, "check_same_thread": False}
        elif parsed.get_backend_name() == "postgresql" and parsed.drivername == "postgresql":
            # Plain postgresql:// would pick psycopg2; we ship psycopg 3.
            url = parsed.set(drivername="postgresql+psycopg").render_as_string(
                hide_password=False
            )
        self.engine: Engine = create_engine(url, **kwargs)
        if self.is_sqlite:
            _sqlite_pragmas(self.engine)
            self._write_engine = self.engine.execution_options(sqlite_begin="IMMEDIATE")
        else:
            self._write_engine = self.engine
        self.nowait = NoWaitReads(url, self.engine.dialect)
        """lookup for a caller on an event loop: never waits, BUSY when it would."""
        self._read = sessionmaker(self.engine, expire_on_commit=False)
        self._write = sessionmaker(self._write_engine, expire_on_commit=False)
        self.pid = os.getpid()

    def create_schema(self) -> None:
        # Several processes start at once (gateway processes, workers): a lost race to create
        # a table is fine, the winner created it. PostgreSQL reports the loser's CREATE TABLE
        # as a unique violation in its catalogue (pg_type), so that one is retried too.
        for attempt in range(10):
            try:
                Base.metadata.create_all(self.engine)
                _add_missing_columns(self.engine)
                return
            except (IntegrityError, OperationalError, ProgrammingError):
                time.sleep(0.1 * (attempt + 1))
        Base.metadata.create_all(self.engine)
        _add_missing_columns(self.engine)

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._read() as session, session.begin():
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        with self._write() as session, session.begin():
            yield session

    def lookup(self, table: Table, key: str, by: str | None = None) -> Any:
        """The row of table whose one-column primary key (or unique column `by`) is key, with
        every column as SQLAlchemy's types convert it (attribute access like an ORM row), or
        None. A Core select on a pooled connection: no ORM session or identity map for the
        hottest read (API keys, read again every few seconds)."""
        with self.engine.connect() as conn:
            return conn.execute(_key_select(table, by), {"key": key}).first()

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")

    def dispose(self) -> None:
        self.engine.dispose()


def _add_missing_columns(engine: Engine) -> None:
    """create_all makes missing tables only: a job table from an older version gets the
    nullable columns added since, so an upgrade keeps its jobs."""
    from sqlalchemy import inspect

    insp = inspect(engine)
    for table in Base.metadata.sorted_tables:
        have = {c["name"] for c in insp.get_columns(table.name)}
        for col in table.columns:
            if col.name in have or not col.nullable:
                continue
            kind = col.type.compile(dialect=engine.dialect)
            with engine.begin() as conn:
                conn.exec_driver_sql(f"ALTER TABLE {table.name} ADD COLUMN {col.name} {kind}")


def _sqlite_pragmas(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        # Let us issue BEGIN ourselves (pysqlite's own transaction handling is incompatible).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        # The busy timeout first: switching to WAL needs a lock that a process starting beside
        # this one may hold for a moment.
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "")
        conn.exec_driver_sql(f"BEGIN {mode}".strip())


_key_selects: dict[tuple[str, str | None], Any] = {}


def _key_column(table: Table, by: str | None) -> Any:
    if by is None:
        (pk,) = table.primary_key.columns
        return pk
    column = table.columns[by]
    assert column.unique or column.primary_key, f"{table.name}.{by} is not unique"
    return column


def _key_select(table: Table, by: str | None = None) -> Any:
    stmt = _key_selects.get((table.name, by))
    if stmt is None:
        column = _key_column(table, by)
        stmt = _key_selects[table.name, by] = select(table).where(column == bindparam("key"))
    return stmt


def advisory_lock(session: Session, name: str) -> None:
    """Serialise transactions that name the same thing, until this transaction ends."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:name, 0))"),
                        {"name": name})
    # SQLite needs nothing: our write transactions begin IMMEDIATE, one writer at a time.


_databases: dict[tuple[int, str], Database] = {}
_lock = threading.Lock()


def get_database(url: str) -> Database:
    """One Database per process and URL; a forked child gets its own, never its parent's."""
    key = (os.getpid(), url)
    with _lock:
        db = _databases.get(key)
        if db is None:
            db = Database(url)
            db.create_schema()
            _databases[key] = db
        return db


def forget_inherited_databases() -> None:
    """In a forked child: drop the parent's pools without closing the parent's connections."""
    with _lock:
        for (pid, _url), db in list(_databases.items()):
            if pid != os.getpid():
                db.engine.dispose(close=False)
                del _databases[(pid, _url)]
