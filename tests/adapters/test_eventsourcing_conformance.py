"""eventsourcing's own recorder test cases, run against procledger's recorders.

procledger's recorders subclass eventsourcing's (``SQLiteRecorder``, ``PostgresRecorder``) and
append inside procledger's own transactions (docs/design.md §3.7, §7.3); eventsourcing ships the
cases its own recorders must pass (``eventsourcing.tests.persistence``), and ours must pass them
too: above all, a duplicate event raises eventsourcing's ``IntegrityError`` -- which procledger's
``IntegrityConflict`` is, as well as a ``WriteConflict`` (§9).

Each case runs on ``memory://``, a SQLite file and (marked ``postgres``) a fresh PostgreSQL
schema, on a store opened as ``open_registry`` opens it. Not run: eventsourcing's text-originator
variants of these cases, as procledger's streams are always UUIDs (uuid5 of the process or
session id, §7.2; the PostgreSQL events table keys them as ``uuid``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from eventsourcing.persistence import AggregateRecorder, ApplicationRecorder, StoredEvent
from eventsourcing.tests.persistence import (
    AggregateRecorderTestCase,
    ApplicationRecorderTestCase,
)

from procledger.adapters.sql.location import parse_store_url
from procledger.adapters.sql.opening import open_store

JOIN_S = 30.0
"""How long closing waits for each thread a case left running (its readers stop at once)."""


class AsAggregateRecorder(AggregateRecorder):
    """procledger's recorder seen as an aggregate recorder only. An application recorder's
    ``insert_events`` returns the notification ids it assigned, where eventsourcing's aggregate
    recorders return ``None`` -- which its aggregate case checks (eventsourcing runs that case
    on its aggregate recorders only). Everything else reaches our recorder unchanged."""

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> None:
        self.recorder.insert_events(stored_events, **kwargs)

    def select_events(
        self,
        originator_id: UUID | str,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> Sequence[StoredEvent]:
        events: Sequence[StoredEvent] = self.recorder.select_events(
            originator_id, gt=gt, lte=lte, desc=desc, limit=limit
        )
        return events


class OnStore:
    """Opens procledger's recorder on a fresh store at ``url``, closed after the test."""

    url: str

    def open_recorder(self) -> Any:
        opened = open_store(parse_store_url(self.url))
        before = set(threading.enumerate())

        def close() -> None:
            # eventsourcing's concurrent cases tell their reader threads to stop but return
            # without joining them; closing the store under a reader's statement would crash
            # the interpreter (docs/design.md §7.3), so the threads the case started end first.
            # (Daemon threads are the drivers' own, such as a connection pool's workers.)
            for thread in set(threading.enumerate()) - before:
                if not thread.daemon:
                    thread.join(JOIN_S)
            opened.close()

        self.addCleanup(close)  # type: ignore[attr-defined]
        return opened.recorder


class OnMemory(OnStore):
    url = "memory://"


class OnSQLiteFile(OnStore):
    @pytest.fixture(autouse=True)
    def _ledger(self, tmp_path: Path) -> None:
        self.url = f"sqlite:///{tmp_path / 'ledger.db'}"


class OnPostgres(OnStore):
    @pytest.fixture(autouse=True)
    def _schema(self, postgres_schema_url: str) -> None:
        self.url = postgres_schema_url


class AsAggregate(OnStore):
    """eventsourcing's aggregate recorder case, on our recorder (mixed in before the case,
    so that only the concrete classes below are test cases)."""

    def create_recorder(self) -> AggregateRecorder:
        return AsAggregateRecorder(self.open_recorder())


class AsApplication(OnStore):
    def create_recorder(self) -> ApplicationRecorder:
        recorder: ApplicationRecorder = self.open_recorder()
        return recorder


class TestMemoryAggregateRecorder(OnMemory, AsAggregate, AggregateRecorderTestCase):
    pass


class TestMemoryApplicationRecorder(OnMemory, AsApplication, ApplicationRecorderTestCase):
    pass


class TestSQLiteAggregateRecorder(OnSQLiteFile, AsAggregate, AggregateRecorderTestCase):
    pass


class TestSQLiteApplicationRecorder(OnSQLiteFile, AsApplication, ApplicationRecorderTestCase):
    pass


@pytest.mark.postgres
class TestPostgresAggregateRecorder(OnPostgres, AsAggregate, AggregateRecorderTestCase):
    pass


@pytest.mark.postgres
class TestPostgresApplicationRecorder(OnPostgres, AsApplication, ApplicationRecorderTestCase):
    def test_insert_subscribe(self) -> None:
        """eventsourcing's subscription (LISTEN, then reads) over our appends, which NOTIFY
        the events table's channel in their transaction (docs/design.md §7.3)."""
        self.optional_test_insert_subscribe()
