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

from collections.abc import Callable
from typing import Any
from uuid import UUID

import orjson

from procledger.adapters.codec import decode_event
from procledger.adapters.sql import events as event_rows
from procledger.adapters.sql import grants as grant_rows
from procledger.adapters.sql import records as record_rows
from procledger.adapters.sql.store import Store, Tx
from procledger.domain.errors import StoreCorrupt, StoreError
from procledger.domain.process import Process
from procledger.domain.rendering import record_document
from procledger.domain.session import Session

Progress = Callable[[int, int], None]
Row = tuple[Any, ...]

BATCH = 2_000
_PROCESS_TOPIC = Process.Registered.TOPIC
_SESSION_TOPIC = Session.Opened.TOPIC


def rebuild_read_models(store: Store, progress: Progress | None = None) -> int:
    """Drop and rebuild ``records`` and ``grants`` and reset tracking; returns events applied."""
    with store.write() as tx:
        store.lock_log(tx)
        total = event_rows.count_events(tx)
        record_rows.clear(tx)
        grant_rows.clear(tx)
        sink = _Sink(tx)
        folder = _Folder(sink)
        with event_rows.stream_log(tx) as rows:
            for row in rows:
                if folder.add(row) and progress is not None:
                    progress(folder.applied, total)
        folder.finish()
        sink.flush()
        record_rows.set_tracking(tx, folder.max_id)
    if progress is not None:
        progress(folder.applied, max(total, folder.applied))
    return folder.applied


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
            raise StoreCorrupt(
                f"rebuild: stored event {self.uuid} v{version} ({topic}) cannot be applied: "
                f"{error!r}"
            ) from error

    def finish(self) -> None:
        aggregate = self.aggregate
        if aggregate is None:
            return
        if self.kind == _PROCESS_TOPIC:
            document = record_document(aggregate, self.last_id)
            self.sink.records.append(record_rows.document_row(document))
        else:
            session_id = aggregate.session_id
            for process_id, descriptor in aggregate.grants.items():
                encoded = None if descriptor is None else orjson.dumps(descriptor).decode()
                self.sink.grants.append((session_id, process_id, encoded))
        self.aggregate = None


class _Sink:
    """Batches rows and writes them (executemany on SQLite, COPY on PostgreSQL)."""

    def __init__(self, tx: Tx) -> None:
        self.tx = tx
        self.records: list[Row] = []
        self.grants: list[Row] = []

    def flush(self) -> None:
        record_rows.bulk_insert(self.tx, self.records)
        grant_rows.bulk_insert(self.tx, self.grants)
        self.records = []
        self.grants = []
