"""Where the ledger lives: transactions on one opened store, and the write unit protocol that
lets an event append carry its side effects.

Every store is SQL underneath: a SQLite file (the embedded default), a private in-memory SQLite
database (``memory://``, for tests), or a PostgreSQL schema. One set of statements serves all
three, and an event append, its lease check, its lease release and its read-model update commit
or roll back together. Driver errors never leave a transaction untranslated (``errors``).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from procledger.adapters.sql.dialect import Dialect
from procledger.adapters.sql.location import StoreLocation
from procledger.domain.errors import StoreError, StoreUnavailable

if TYPE_CHECKING:  # only a type here: the CLI's fast path reads through ``Tx`` without it
    from eventsourcing.persistence import InfrastructureFactory, StoredEvent

T = TypeVar("T")

RETRY_FIRST_PAUSE_S = 0.02
RETRY_MAX_PAUSE_S = 0.2
"""A call that lost its server retries at most this far apart, so it gets through within a
fraction of a second of the server accepting connections again (docs/design.md §7.3)."""


def retry_pauses(window_s: float) -> Any:
    """Pauses (seconds) of a capped exponential backoff that ends when ``window_s`` has passed
    since the first call: the sleeps a caller makes between attempts."""
    deadline = time.monotonic() + window_s
    pause = RETRY_FIRST_PAUSE_S
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        yield min(pause, left)
        pause = min(pause * 2, RETRY_MAX_PAUSE_S)


def is_stored_int(value: object) -> bool:
    """Whether a column read back holds an integer, as procledger writes every integer column:
    SQLite does not enforce a column's type, so a damaged file may hold text, a BLOB, a float
    or NULL there."""
    return isinstance(value, int) and not isinstance(value, bool)


def ride_through(location: StoreLocation, action: Callable[[], T]) -> T:
    """``action()``, called again while it raises ``StoreUnavailable`` and the location's retry
    window lasts (the one ride-through loop: connecting, and whole transactions). Past the
    window the last ``StoreUnavailable`` is raised; any other error at once."""
    pauses = retry_pauses(location.retry_s)
    while True:
        try:
            return action()
        except StoreUnavailable:
            pause = next(pauses, None)
            if pause is None:
                raise
            time.sleep(pause)


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

    def side(self) -> Tx:
        """Another cursor in this transaction: a statement run on it keeps its result while
        this one runs more, so a batched transaction (``batch``) can send a read early and
        read its answer later."""
        return Tx(self.cursor.connection.cursor(), self.dialect)

    def batch(self) -> None:
        """Let the rest of this transaction send statements without waiting for each result
        (PostgreSQL's pipeline mode; a no-op on SQLite, which has no round trips)."""

    @property
    def batching(self) -> bool:
        """Whether ``batch`` is in effect: only then is a read sent early worth its cost."""
        return False


class WriteUnit(Protocol):
    """Side effects that must commit with an event append, or not at all."""

    def before(self, tx: Tx) -> None: ...

    def after(self, tx: Tx, notification_ids: Sequence[int]) -> None: ...


class ChangeListener(Protocol):
    """A descriptor that becomes readable when another connection committed an append."""

    def fileno(self) -> int: ...

    def drain(self) -> bool: ...

    def close(self) -> None: ...


class Backend(abc.ABC):
    """One kind of database behind a ``Store``: how its location is prepared and opened, its
    own connections and transactions, and the recorder that appends to its events table.

    Each kind is one subclass (``SQLiteBackend``, ``PostgresBackend``), chosen once per
    location (``opening.backend_class``): nothing else asks which database it is talking to,
    and the ``Store`` holds its backend rather than attributes set on it from outside
    (docs/design.md §7.3).
    """

    dialect: Dialect

    def __init__(self, location: StoreLocation, *, read_only: bool = False) -> None:
        self.location = location
        self.read_only = read_only
        """Whether this backend only reads: a read-only open's (docs/design.md §7.1)."""
        self.change_channel: str | None = None
        """The channel every append NOTIFYs in its transaction (PostgreSQL only)."""

    @classmethod
    @abc.abstractmethod
    def prepare(cls, location: StoreLocation, *, create: bool, read_only: bool = False) -> None:
        """Fail early, naming the URL, where eventsourcing would fail obscurely; create the
        file, folder or schema only when ``create``; with ``read_only``, check only what a
        reader needs."""

    @property
    def creates_tables_read_only(self) -> bool:
        """Whether a read-only open may create the tables of a store that has none (an empty
        schema or file, ``memory://``: docs/design.md §7.1): not where its connections only
        read (a SQLite file that holds data)."""
        return True

    def opening_lock(self) -> AbstractContextManager[object]:
        """Held while the schema is created or migrated (across processes where the database
        needs it: PostgreSQL)."""
        return nullcontext()

    @abc.abstractmethod
    def infrastructure(self) -> InfrastructureFactory[Any]:
        """eventsourcing's factory for this location: its datastore serves the recorder's own
        methods and creates the events table."""

    @abc.abstractmethod
    def recorder(self, datastore: Any, store: Store) -> Any:
        """The recorder that appends to the events table inside ``store``'s transactions."""

    @abc.abstractmethod
    def begin(self, write: bool) -> AbstractContextManager[Tx]:
        """A transaction on a connection of this backend's own (``True``: a write)."""

    def lock_log(self, tx: Tx) -> None:
        """Hold the events table's write lock until ``tx`` ends (a no-op where the database's
        writer lock already serialises appends: SQLite)."""
        return

    def change_listener(self) -> ChangeListener | None:
        """A listener told of other connections' appends, or ``None`` where the database has
        no such channel (SQLite: followers poll)."""
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Close this backend's connections (busy ones when their transaction ends)."""


class Store:
    """Transactions and table names for one opened location, on its one backend."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.location = backend.location
        self.dialect = backend.dialect
        self.read_only = False
        """Whether a write is refused: a read-only open never writes (docs/design.md §7.1)."""

    def refuse_writes(self) -> None:
        """From now on refuse to begin a write: what a read-only open ends with, once any
        schema step it needed is done."""
        self.read_only = True

    def table(self, name: str) -> str:
        """A side table's qualified name (events live in eventsourcing's own table)."""
        return self.dialect.table(name)

    @property
    def events_table(self) -> str:
        return self.dialect.events_table

    @property
    def change_channel(self) -> str | None:
        """The channel every append NOTIFYs in its transaction (PostgreSQL only)."""
        return self.backend.change_channel

    def begin(self, write: bool) -> AbstractContextManager[Tx]:
        """Open a transaction (``True``: a write)."""
        if write and self.read_only:
            raise StoreError(
                f"store {self.location.masked!r} was opened read-only: it cannot be written"
            )
        return self.backend.begin(write)

    def write(self) -> AbstractContextManager[Tx]:
        """A serialised write transaction (SQLite: BEGIN IMMEDIATE, so no upgrade deadlock)."""
        return self.begin(True)

    def read(self) -> AbstractContextManager[Tx]:
        return self.begin(False)

    def attempt(self, body: Callable[[Tx], T], *, write: bool = False) -> T:
        """``body(tx)`` in one transaction, run again from scratch while the store is
        ``StoreUnavailable`` and the location's retry window (PostgreSQL's ``retry_s``) lasts.

        ``body`` must be safe to run again: it reads what it decides on inside ``tx`` (so a
        commit whose outcome was lost is seen by the next run, never silently doubled).
        Past the window the last ``StoreUnavailable`` is raised, naming the masked URL.
        """

        def run() -> T:
            with self.begin(write) as tx:
                return body(tx)

        try:
            return ride_through(self.location, run)
        except StoreUnavailable as error:
            raise _past_window(self.location, error) from error.__cause__

    def lock_log(self, tx: Tx) -> None:
        """Hold the events table's write lock until ``tx`` ends (a no-op on SQLite, whose
        writer lock already serialises appends)."""
        self.backend.lock_log(tx)

    def close(self) -> None:
        self.backend.close()


def _past_window(location: StoreLocation, error: StoreUnavailable) -> StoreUnavailable:
    if location.retry_s <= 0:
        return error
    return StoreUnavailable(f"{error} (still failing after retrying for {location.retry_s:g} s)")


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
