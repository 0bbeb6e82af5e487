"""Where the ledger lives: store URLs, transactions, and recorders that write side effects
in the same transaction as the events.

Every store is SQL underneath: a SQLite file (the embedded default), a private in-memory SQLite
database (``memory://``, for tests), or a PostgreSQL schema. That lets one set of statements
serve all three, and lets an event append, its lease check, its lease release and its read-model
update commit or roll back together — the atomicity the contract asks for.

Statements are written with ``?`` placeholders; ``Tx`` rewrites them for psycopg.
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

from eventsourcing.persistence import IntegrityError, StoredEvent
from eventsourcing.sqlite import SQLiteApplicationRecorder

from procledger.domain.errors import StoreError

if TYPE_CHECKING:
    from eventsourcing.postgres import PostgresDatastore

Dialect = Literal["sqlite", "postgresql"]
_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
APPLICATION_NAME = "procledger"
SQLITE_LOCK_TIMEOUT_S = 60  # how long a writer waits for another to commit


# -- URLs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoreLocation:
    """A parsed store URL. ``masked`` is what messages show (never the password)."""

    dialect: Dialect
    masked: str
    sqlite_path: str = ""
    in_memory: bool = False
    pg: dict[str, str] = field(default_factory=dict)
    schema: str = "public"


def default_url() -> str:
    configured = os.environ.get("PROCLEDGER_URL")
    if configured:
        return configured
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return f"sqlite:///{data_home}/procledger/ledger.db"


def mask_url(url: str) -> str:
    return re.sub(r"(//[^:/@]*:)[^@]*@", r"\1***@", url)


def parse_store_url(url: str) -> StoreLocation:
    masked = mask_url(url)
    if url == "memory://" or url.startswith("memory:"):
        return StoreLocation("sqlite", masked, in_memory=True)
    if url.startswith("sqlite:"):
        return _parse_sqlite(url, masked)
    if url.startswith(("postgresql://", "postgres://")):
        return _parse_postgres(url, masked)
    raise StoreError(
        f"store URL {masked!r}: unknown scheme (use memory://, sqlite:///path.db "
        "or postgresql://user:password@host:port/dbname)"
    )


def _parse_sqlite(url: str, masked: str) -> StoreLocation:
    rest = url[len("sqlite:") :]
    path = rest[2:] if rest.startswith("//") else rest
    if not path or path == "/":
        raise StoreError(f"store URL {masked!r}: no database path")
    return StoreLocation("sqlite", masked, sqlite_path=unquote(path))


def _parse_postgres(url: str, masked: str) -> StoreLocation:
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    schema = query.get("schema", ["public"])[0]
    if not _SCHEMA_NAME.match(schema):
        raise StoreError(f"store URL {masked!r}: schema {schema!r} is not a plain identifier")
    dbname = parts.path.lstrip("/")
    if not dbname or not parts.hostname:
        raise StoreError(f"store URL {masked!r}: needs a host and a database name")
    try:
        port = parts.port or 5432
    except ValueError:  # not a number, or out of range
        raise StoreError(f"store URL {masked!r}: the port must be a number 1-65535") from None
    pg = {
        "dbname": unquote(dbname),
        "host": parts.hostname,
        "port": str(port),
        "user": unquote(parts.username or os.environ.get("USER", "postgres")),
        "password": unquote(parts.password or ""),
    }
    return StoreLocation("postgresql", masked, pg=pg, schema=schema)


# -- transactions -------------------------------------------------------------------------------


class Tx:
    """One open transaction: ``?``-style statements on either dialect."""

    _converted: ClassVar[dict[str, str]] = {}

    def __init__(self, cursor: Any, dialect: Dialect) -> None:
        self.cursor = cursor
        self.dialect = dialect

    def execute(self, statement: str, params: Sequence[Any] = ()) -> Tx:
        if self.dialect == "postgresql":
            converted = self._converted.get(statement)
            if converted is None:
                converted = self._converted[statement] = statement.replace("?", "%s")
            statement = converted
        self.cursor.execute(statement, params)
        return self

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


class Store:
    """Transactions and table names for one opened location."""

    def __init__(self, location: StoreLocation) -> None:
        self.location = location
        self.dialect: Dialect = location.dialect
        self.sqlite: SQLiteConnections | None = None  # set by the registry when opened
        self.postgres: PostgresDatastore | None = None

    def table(self, name: str) -> str:
        """A side table's qualified name (events live in eventsourcing's own table)."""
        if self.dialect == "postgresql":
            return f'"{self.location.schema}"."procledger_{name}"'
        return f"procledger_{name}"

    @property
    def events_table(self) -> str:
        if self.dialect == "postgresql":
            return f'"{self.location.schema}"."{APPLICATION_NAME}_events"'
        return "stored_events"

    @property
    def notification_id_column(self) -> str:
        return "notification_id" if self.dialect == "postgresql" else "rowid"

    def write(self) -> AbstractContextManager[Tx]:
        """A serialised write transaction (SQLite: BEGIN IMMEDIATE, so no upgrade deadlock)."""
        if self.sqlite is not None:
            return _SQLiteTransaction(self.sqlite, write=True)
        return self._postgres_transaction(write=True)

    def read(self) -> AbstractContextManager[Tx]:
        if self.sqlite is not None:
            return _SQLiteTransaction(self.sqlite, write=False)
        return self._postgres_transaction(write=False)

    @contextmanager
    def _postgres_transaction(self, *, write: bool) -> Iterator[Tx]:
        assert self.postgres is not None
        with self.postgres.transaction(commit=write) as cursor:
            yield Tx(cursor, "postgresql")

    def close(self) -> None:
        if self.sqlite is not None:
            self.sqlite.close()


class SQLiteConnections:
    """The connections of one SQLite store, held here rather than borrowed per transaction
    from eventsourcing's pool: the pool's fairness semaphore, writer lock and bookkeeping cost
    more than an empty transaction, and a command is one transaction.

    Idle connections wait on one stack; a transaction takes the last one put back (a nested
    transaction takes a second) and any thread may take any of them. SQLite's file locks and
    ``BEGIN IMMEDIATE`` serialise writers across threads and processes. A shared-cache
    in-memory database reports lock conflicts as errors instead of waiting, so there
    transactions also take one lock. At most ``_KEPT_IDLE`` stay open between transactions;
    ``close`` closes the idle ones at once and those in use when their transaction ends
    (closing a connection under another thread's statement crashes the interpreter). A forked
    child starts with none of its parent's.
    """

    _KEPT_IDLE = 8

    def __init__(self, database: str, *, in_memory: bool, timeout: float) -> None:
        self.database = database
        self.timeout = timeout
        self._serialised: threading.RLock | None = threading.RLock() if in_memory else None
        self._idle: list[sqlite3.Connection] = []
        self._closed = False
        _OPEN_STORES.add(self)

    def acquire(self) -> sqlite3.Connection:
        """A connection for one transaction; give it back with ``release``."""
        if self._serialised is not None:
            self._serialised.acquire()
        try:
            return self._take()
        except BaseException:
            if self._serialised is not None:
                self._serialised.release()
            raise

    def release(self, connection: sqlite3.Connection) -> None:
        try:
            self._give_back(connection)
        finally:
            if self._serialised is not None:
                self._serialised.release()

    def close(self) -> None:
        self._closed = True
        while True:
            try:
                idle = self._idle.pop()  # atomic: a connection is idle or in use, never both
            except IndexError:
                break
            idle.close()

    def forget_after_fork(self) -> None:
        """In a forked child: never touch the parent's connections (not even to close them)."""
        self._idle = []

    def _take(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreError("the registry is closed")
        try:
            return self._idle.pop()
        except IndexError:  # none idle (or ``close`` just took them)
            return self._connect()

    def _give_back(self, connection: sqlite3.Connection) -> None:
        if len(self._idle) < self._KEPT_IDLE and not self._closed:
            self._idle.append(connection)
            if not self._closed:
                return
            try:  # ``close`` ran in between: whoever takes it back closes it
                self._idle.remove(connection)
            except ValueError:
                return
        connection.close()

    def _connect(self) -> sqlite3.Connection:
        try:
            connection = sqlite3.connect(
                self.database,
                uri=True,
                check_same_thread=False,
                isolation_level=None,
                cached_statements=256,
                timeout=self.timeout,
            )
        except sqlite3.Error as error:
            raise StoreError(f"cannot open the SQLite database: {error}") from error
        connection.row_factory = sqlite3.Row
        return connection


_OPEN_STORES: weakref.WeakSet[SQLiteConnections] = weakref.WeakSet()


def _forget_parents_connections() -> None:
    for connections in list(_OPEN_STORES):
        connections.forget_after_fork()


os.register_at_fork(after_in_child=_forget_parents_connections)


class _SQLiteTransaction:
    """One SQLite transaction as a plain context manager (a generator-based one costs a few
    microseconds per layer, and this runs once per command)."""

    __slots__ = ("_connection", "_connections", "_cursor", "_write")

    def __init__(self, connections: SQLiteConnections, *, write: bool) -> None:
        self._connections = connections
        self._write = write

    def __enter__(self) -> Tx:
        self._connection = connection = self._connections.acquire()
        try:
            self._cursor = cursor = connection.cursor()
            cursor.execute("BEGIN IMMEDIATE" if self._write else "BEGIN")
        except BaseException:
            self._connections.release(connection)
            raise
        return Tx(cursor, "sqlite")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        connection = self._connection
        try:
            try:
                if error is None and self._write:
                    connection.commit()
                else:
                    connection.rollback()
            except BaseException:
                connection.rollback()
                raise
            finally:
                self._cursor.close()
        finally:
            self._connections.release(connection)
        if isinstance(error, sqlite3.IntegrityError):  # eventsourcing maps psycopg's already
            raise IntegrityError(str(error)) from error


# -- recorders ----------------------------------------------------------------------------------


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


class SQLiteRecorder(SQLiteApplicationRecorder):
    """Appends events and runs the write unit's side effects in one transaction."""

    store: Store

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> list[int]:
        with self.store.write() as tx:
            return append_in(tx, kwargs.get("unit"), stored_events, self._insert_one)

    def _insert_one(self, tx: Tx, stored: StoredEvent) -> int:
        originator_id = stored.originator_id
        tx.execute(
            self.insert_events_statement,
            (
                originator_id.hex if isinstance(originator_id, uuid.UUID) else originator_id,
                stored.originator_version,
                stored.topic,
                stored.state,
            ),
        )
        return int(tx.cursor.lastrowid)


# -- opening ------------------------------------------------------------------------------------


def application_env(location: StoreLocation) -> dict[str, str]:
    """The eventsourcing environment for a location; never merged with ``os.environ``."""
    if location.dialect == "sqlite":
        name = (
            f"file:procledger-{uuid.uuid4().hex}?mode=memory&cache=shared"
            if location.in_memory
            else location.sqlite_path
        )
        return {
            "PERSISTENCE_MODULE": "eventsourcing.sqlite",
            "SQLITE_DBNAME": name,
            "SQLITE_LOCK_TIMEOUT": str(SQLITE_LOCK_TIMEOUT_S),
            "APPLICATION_RECORDER_TOPIC": f"{__name__}:SQLiteRecorder",
        }
    pg = location.pg
    return {
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_DBNAME": pg["dbname"],
        "POSTGRES_HOST": pg["host"],
        "POSTGRES_PORT": pg["port"],
        "POSTGRES_USER": pg["user"],
        "POSTGRES_PASSWORD": pg["password"],
        "POSTGRES_SCHEMA": location.schema,
        "POSTGRES_POOL_SIZE": "2",
        "POSTGRES_MAX_OVERFLOW": "8",
        "POSTGRES_CONNECT_TIMEOUT": "5",
        "POSTGRES_IDLE_IN_TRANSACTION_SESSION_TIMEOUT": "0",
        "APPLICATION_RECORDER_TOPIC": "procledger.adapters.postgres:PostgresRecorder",
    }


def prepare_location(location: StoreLocation) -> None:
    """Fail early, with the URL named, where eventsourcing would fail obscurely."""
    if location.dialect == "sqlite" and not location.in_memory:
        path = Path(location.sqlite_path)
        if not path.parent.is_dir():
            raise StoreError(f"store URL {location.masked!r}: folder {path.parent} does not exist")
        try:
            sqlite3.connect(location.sqlite_path).close()
        except sqlite3.Error as error:
            raise StoreError(f"store URL {location.masked!r}: cannot open: {error}") from None
    if location.dialect == "postgresql":
        from procledger.adapters.postgres import create_schema  # psycopg only when needed

        create_schema(location)


@contextmanager
def opening_lock(location: StoreLocation) -> Iterator[None]:
    """Serialise opening one PostgreSQL schema across processes (a no-op for SQLite)."""
    if location.dialect != "postgresql":
        yield
        return
    from procledger.adapters.postgres import schema_opening_lock  # psycopg only when needed

    with schema_opening_lock(location):
        yield
