"""Primary-key reads an event loop may make on its own thread, because they never wait.

A status poll's row read is a few tens of microseconds of SQLite; handing it to a worker thread
and back costs several times that, and the thread and the loop then contend for the GIL while
other polls queue. So the embedded job table is read here on the calling thread, on that
thread's own connection with no busy timeout: a read that would have to wait (a lock, a file
that cannot be opened, any error) gives up at once with BUSY, and the caller makes the usual
read in a worker thread, which waits and fails as every other read does. In WAL mode a reader
does not wait for writers, so BUSY is rare. Other databases (PostgreSQL: a network round trip)
always answer BUSY.

Rows come back as `Database.lookup` gives them: every column, converted by the column types'
own result processors for the SQLite dialect (pysqlite reports no column types, so these are
the processors SQLAlchemy applies itself), with attribute access.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import namedtuple
from collections.abc import Callable
from typing import Any

from sqlalchemy import Table
from sqlalchemy.engine import make_url

BUSY: Any = object()
"""What a read answers when it would have to wait: read with Database.lookup in a thread."""


class _Reader:
    """The SELECT of one table by its key column, and how to convert the row it gives."""

    def __init__(self, table: Table, by: str | None, dialect: Any) -> None:
        if by is None:
            (key,) = table.primary_key.columns
        else:
            key = table.columns[by]
            assert key.unique or key.primary_key, f"{table.name}.{by} is not unique"
        names = [c.name for c in table.columns]
        quote = dialect.identifier_preparer.quote
        self.sql = (f"SELECT {', '.join(quote(n) for n in names)} FROM {quote(table.name)} "
                    f"WHERE {quote(key.name)} = ?")
        self.row_type = namedtuple(f"{table.name}_row", names)  # type: ignore[misc]
        self.processors: list[tuple[int, Callable[[Any], Any]]] = []
        for i, column in enumerate(table.columns):
            process = column.type.dialect_impl(dialect).result_processor(dialect, None)
            if process is not None:
                self.processors.append((i, process))

    def row(self, raw: tuple[Any, ...]) -> Any:
        values = list(raw)
        for i, process in self.processors:
            values[i] = process(values[i])
        return self.row_type._make(values)


class NoWaitReads:
    """Database.lookup without waiting, for one SQLite database file (see the module)."""

    def __init__(self, url: str, dialect: Any) -> None:
        parsed = make_url(url)
        db = parsed.database
        self.path = (db if parsed.get_backend_name() == "sqlite" and db and db != ":memory:"
                     and not db.startswith("file:") else None)
        self.dialect = dialect
        self._readers: dict[tuple[str, str | None], _Reader] = {}
        self._local = threading.local()

    def lookup(self, table: Table, key: str, by: str | None = None) -> Any:
        """The row, or None when there is none; BUSY when reading it would mean waiting."""
        if self.path is None:
            return BUSY
        reader = self._readers.get((table.name, by))
        if reader is None:
            reader = self._readers[table.name, by] = _Reader(table, by, self.dialect)
        try:
            conn = self._connection()
            raw = conn.execute(reader.sql, (key,)).fetchone()
        except sqlite3.Error:
            self._drop()
            return BUSY
        return None if raw is None else reader.row(raw)

    def _connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            # timeout=0: a lock is BUSY at once, never a wait; autocommit, so one SELECT is
            # its own read transaction and nothing stays open between polls.
            conn = sqlite3.connect(self.path, timeout=0, isolation_level=None)  # type: ignore[arg-type]
            try:
                conn.execute("PRAGMA query_only=ON")
            except sqlite3.Error:
                conn.close()
                raise
            self._local.conn = conn
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()
