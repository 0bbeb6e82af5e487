"""Where the ledger lives: transactions on one opened store, and the write unit protocol that
lets an event append carry its side effects.

Every store is SQL underneath: a SQLite file (the embedded default), a private in-memory SQLite
database (``memory://``, for tests), or a PostgreSQL schema. One set of statements serves all
three, and an event append, its lease check, its lease release and its read-model update commit
or roll back together. Driver errors never leave a transaction untranslated (``errors``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from eventsourcing.persistence import StoredEvent

from procledger.adapters.sql.dialect import Dialect, dialect_for
from procledger.adapters.sql.errors import is_driver_error, translate
from procledger.adapters.sql.location import StoreLocation

if TYPE_CHECKING:
    from eventsourcing.postgres import PostgresDatastore

    from procledger.adapters.sql.sqlite import SQLiteConnections


class Tx:
    """One open transaction: ``?``-style statements on either dialect."""

    __slots__ = ("cursor", "dialect")

    def __init__(self, cursor: Any, dialect: Dialect) -> None:
        self.cursor = cursor
        self.dialect = dialect

    def execute(self, statement: str, params: Sequence[Any] = ()) -> Tx:
        self.cursor.execute(self.dialect.statement(statement), params)
        return self

    def executemany(self, statement: str, rows: Sequence[Sequence[Any]]) -> None:
        self.cursor.executemany(self.dialect.statement(statement), rows)

    def one(self) -> Any:
        return self.cursor.fetchone()

    def all(self) -> list[Any]:
        return list(self.cursor.fetchall())

    @property
    def rowcount(self) -> int:
        return int(self.cursor.rowcount)


class WriteUnit(Protocol):
    """Side effects that must commit with an event append, or not at all."""

    def before(self, tx: Tx) -> None: ...

    def after(self, tx: Tx, notification_ids: Sequence[int]) -> None: ...


class Store:
    """Transactions and table names for one opened location."""

    def __init__(self, location: StoreLocation) -> None:
        self.location = location
        self.dialect = dialect_for(location)
        self.sqlite: SQLiteConnections | None = None  # set when the store is opened
        self.postgres: PostgresDatastore | None = None
        self.begin: Callable[[bool], AbstractContextManager[Tx]] = self._postgres_transaction
        """Opens a transaction (``True``: a write); SQLite stores replace it when attached."""
        self.log_lock: Sequence[Any] = ()
        """Statements that take the events table's write lock (PostgreSQL): appends then
        commit in notification-id order, so a feed reader never sees a later id first."""

    def table(self, name: str) -> str:
        """A side table's qualified name (events live in eventsourcing's own table)."""
        return self.dialect.table(name)

    @property
    def events_table(self) -> str:
        return self.dialect.events_table

    def write(self) -> AbstractContextManager[Tx]:
        """A serialised write transaction (SQLite: BEGIN IMMEDIATE, so no upgrade deadlock)."""
        return self.begin(True)

    def read(self) -> AbstractContextManager[Tx]:
        return self.begin(False)

    @contextmanager
    def _postgres_transaction(self, write: bool) -> Iterator[Tx]:
        assert self.postgres is not None
        try:
            with self.postgres.transaction(commit=write) as cursor:
                yield Tx(cursor, self.dialect)
        except Exception as error:
            if is_driver_error(error):
                raise translate(error, f"store {self.location.masked!r}") from error
            raise

    def lock_log(self, tx: Tx) -> None:
        """Hold the events table's write lock until ``tx`` ends (a no-op on SQLite, whose
        writer lock already serialises appends)."""
        for statement in self.log_lock:
            tx.cursor.execute(statement)

    def close(self) -> None:
        if self.sqlite is not None:
            self.sqlite.close()


def _events_to_append(
    tx: Tx, unit: WriteUnit | None, stored_events: Sequence[StoredEvent]
) -> Sequence[StoredEvent] | None:
    """The given events, plus those a deciding unit chooses inside the write transaction.

    A unit with ``decide(tx) -> events`` reads the current log under the write lock and
    decides there, so load, decision and append are one transaction (no conflict to retry).
    ``None``: the unit decided to write nothing at all.
    """
    decide = getattr(unit, "decide", None)
    if decide is None:
        return stored_events
    decided = [*stored_events, *decide(tx)]
    return decided or None


def append_in(
    tx: Tx,
    unit: WriteUnit | None,
    stored_events: Sequence[StoredEvent],
    insert_one: Callable[[Tx, StoredEvent], int],
) -> list[int]:
    """One append with its side effects, in the open write transaction ``tx``: let a deciding
    unit add its events, check (``before``), insert each event, then project (``after``)."""
    to_append = _events_to_append(tx, unit, stored_events)
    if to_append is None:
        return []
    if unit is not None:
        unit.before(tx)
    ids = [insert_one(tx, stored) for stored in to_append]
    if unit is not None:
        unit.after(tx, ids)
    return ids
