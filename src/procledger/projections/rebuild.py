"""Rebuild every read model from the event log, in one write transaction.

The log is streamed in ``(originator_id, originator_version)`` order, so each aggregate's events
arrive together and are folded one at a time: memory holds one aggregate and one batch of rows,
however long the log. A Process becomes its ``records`` row (``change_seq`` = the highest
notification id among its events, exactly what the live projection wrote); a Session becomes
its ``grants`` rows. Other streams (the retention log, or a stream that does not begin with a
creation event) are counted and skipped.

Writers wait for the rebuild (SQLite's single writer; PostgreSQL's events-table lock), and
readers keep seeing the previous models until it commits, so nobody ever sees a half-built
model. On failure the transaction rolls back and the previous models stay as they were.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

import orjson

from procledger.adapters.codec import decode_event
from procledger.adapters.store import Store, Tx
from procledger.domain.errors import StoreError
from procledger.domain.process import Process
from procledger.domain.session import Session
from procledger.projections.records import RECORD_COLUMNS, document_row

Progress = Callable[[int, int], None]
Row = tuple[Any, ...]

BATCH = 2_000
_PROCESS_TOPIC = Process.Registered.TOPIC
_SESSION_TOPIC = Session.Opened.TOPIC


def rebuild_read_models(
    store: Store, lock_statements: list[Any], progress: Progress | None = None
) -> int:
    """Drop and rebuild ``records`` and ``grants`` and reset tracking; returns events applied."""
    with store.write() as tx:
        for statement in lock_statements:
            tx.cursor.execute(statement)
        total = int(tx.execute(f"SELECT COUNT(*) AS n FROM {store.events_table}").one()["n"])
        tx.execute(f"DELETE FROM {store.table('records')}")
        tx.execute(f"DELETE FROM {store.table('grants')}")
        sink = _Sink(tx, store)
        folder = _Folder(sink)
        with _stream(tx, store) as rows:
            for row in rows:
                if folder.add(row) and progress is not None:
                    progress(folder.applied, total)
        folder.finish()
        sink.flush()
        tx.execute(
            f"UPDATE {store.table('tracking')} SET position=? WHERE name='records'",
            (folder.max_id,),
        )
    if progress is not None:
        progress(folder.applied, max(total, folder.applied))
    return folder.applied


@contextmanager
def _stream(tx: Tx, store: Store) -> Iterator[Iterator[Row]]:
    """``(notification_id, originator_id, version, topic, state)`` rows, one aggregate after
    another, fetched lazily (a server-side cursor on PostgreSQL)."""
    query = (
        f"SELECT {store.notification_id_column}, originator_id, originator_version, topic, state "
        f"FROM {store.events_table} ORDER BY originator_id, originator_version"
    )
    connection = tx.cursor.connection
    if store.dialect == "postgresql":
        from psycopg.rows import tuple_row  # psycopg only for PostgreSQL stores

        with connection.cursor(name="procledger_rebuild", row_factory=tuple_row) as cursor:
            cursor.itersize = BATCH
            cursor.execute(query)
            yield iter(cursor)
    else:
        cursor = connection.cursor()
        cursor.row_factory = None
        try:
            cursor.execute(query)
            yield iter(cursor)
        finally:
            cursor.close()


class _Folder:
    """Folds consecutive events of one aggregate; hands each finished one to the sink."""

    def __init__(self, sink: _Sink) -> None:
        self.sink = sink
        self.current: Any = None
        self.uuid = UUID(int=0)
        self.kind: str | None = None
        self.aggregate: Any = None
        self.last_id = 0
        self.max_id = 0
        self.applied = 0

    def add(self, row: Row) -> bool:
        """Fold one event; True when a batch was written (time to report progress)."""
        notification_id, originator_id, version, topic, state = row
        if originator_id != self.current:
            self.finish()
            self.start(originator_id, topic)
        self.last_id = max(self.last_id, notification_id)
        self.max_id = max(self.max_id, notification_id)
        if self.kind is not None:
            self.apply(version, topic, state)
        self.applied += 1
        if self.applied % BATCH == 0:
            self.sink.flush()
            return True
        return False

    def start(self, originator_id: Any, topic: str) -> None:
        self.current = originator_id
        self.uuid = originator_id if isinstance(originator_id, UUID) else UUID(originator_id)
        self.kind = topic if topic in (_PROCESS_TOPIC, _SESSION_TOPIC) else None
        self.aggregate = None
        self.last_id = 0

    def apply(self, version: int, topic: str, state: bytes) -> None:
        try:
            self.aggregate = decode_event(self.uuid, version, topic, state).mutate(self.aggregate)
        except StoreError:
            raise
        except Exception as error:
            raise StoreError(
                f"rebuild: stored event {self.uuid} v{version} ({topic}) cannot be applied: "
                f"{error!r}"
            ) from error

    def finish(self) -> None:
        aggregate = self.aggregate
        if aggregate is None:
            return
        if self.kind == _PROCESS_TOPIC:
            self.sink.records.append(document_row(aggregate.record_document(self.last_id)))
        else:
            session_id = aggregate.session_id
            for process_id, descriptor in aggregate.grants.items():
                encoded = None if descriptor is None else orjson.dumps(descriptor).decode()
                self.sink.grants.append((session_id, process_id, encoded))
        self.aggregate = None


class _Sink:
    """Batches rows and writes them (executemany on SQLite, COPY on PostgreSQL)."""

    def __init__(self, tx: Tx, store: Store) -> None:
        self.tx = tx
        self.store = store
        self.records: list[Row] = []
        self.grants: list[Row] = []

    def flush(self) -> None:
        self._write("records", RECORD_COLUMNS, self.records)
        self._write("grants", "session_id, process_id, descriptor", self.grants)
        self.records = []
        self.grants = []

    def _write(self, table: str, columns: str, rows: list[Row]) -> None:
        if not rows:
            return
        name = self.store.table(table)
        cursor = self.tx.cursor
        if self.store.dialect == "postgresql":
            with cursor.copy(f"COPY {name} ({columns}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            marks = ",".join("?" * (columns.count(",") + 1))
            cursor.executemany(f"INSERT INTO {name} ({columns}) VALUES ({marks})", rows)
