"""The PostgreSQL backend (``PostgresBackend``), imported only for ``postgresql://`` URLs.

Keeping psycopg and eventsourcing's PostgreSQL module out of every other module keeps SQLite
commands (and ``procledger`` start-up) from paying for them.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, NoReturn

import psycopg
from eventsourcing.persistence import StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore, PostgresFactory
from eventsourcing.utils import Environment
from psycopg import IsolationLevel
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row

from procledger.adapters.sql.dialect import APPLICATION_NAME, Dialect, PostgresDialect
from procledger.adapters.sql.errors import is_driver_error, translate
from procledger.adapters.sql.location import StoreLocation
from procledger.adapters.sql.store import Backend, Store, Tx, append_in, ride_through
from procledger.domain.errors import StoreError, StoreURLError

_logger = logging.getLogger("procledger.store")
SAY_WAITING_AFTER_S = 2.0
"""How long opening waits for an unreachable server before it says that it is waiting."""

CONNECT_TIMEOUT_S = 5
"""How long one connection attempt may take (a server that does not answer at all)."""


_Began = AbstractContextManager[psycopg.Transaction]
"""A transaction already entered (its ``BEGIN`` answered); leave it with ``__exit__``."""


class PostgresConnections:
    """The connections of one PostgreSQL store, held here rather than in eventsourcing's pool.

    The pool reconnects in the background with a backoff that grows to seconds, so after a
    server restart writes resumed only 8-9.5 s after the server accepted again. Here a
    connection is taken from an idle stack and its transaction begun at once: the ``BEGIN``
    is the liveness check (a server restart leaves every idle connection dead), so a dead one
    is dropped -- before anything of the transaction ran -- and the next tried, or a new one
    opened; no separate ping costs a round trip. While the server refuses connections,
    ``begin`` retries with a capped backoff (20 ms doubling to 200 ms) for the location's
    retry window, then raises ``StoreUnavailable`` naming the masked URL (docs/design.md §7.3).
    """

    _KEPT_IDLE = 8

    def __init__(self, location: StoreLocation) -> None:
        self.location = location
        self._conninfo = conninfo(location)
        self._idle: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()
        self._closed = False

    def begin(self, write: bool) -> tuple[psycopg.Connection[Any], _Began]:
        """A live connection with a transaction begun on it (rolled back at its end unless
        ``write``); give the connection back with ``release``."""
        return ride_through(self.location, functools.partial(self._live, write))

    def release(self, connection: psycopg.Connection[Any]) -> None:
        healthy = (
            not connection.closed and connection.info.transaction_status == TransactionStatus.IDLE
        )
        with self._lock:
            if healthy and not self._closed and len(self._idle) < self._KEPT_IDLE:
                self._idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _live(self, write: bool) -> tuple[psycopg.Connection[Any], _Began]:
        """An idle connection whose ``BEGIN`` succeeds (the server may have restarted since
        it was used: then it is dropped and the next tried), else a new one."""
        while True:
            with self._lock:
                if self._closed:
                    raise StoreError("the registry is closed")
                connection = self._idle.pop() if self._idle else None
            fresh = connection is None
            if connection is None:
                connection = self._connect()
            # A read sees one snapshot for all its statements (a log and its head row read by
            # two, a commit between them, would not verify); writes stay READ COMMITTED, where
            # their row locks and ``ON CONFLICT`` read what committed meanwhile.
            connection.isolation_level = None if write else IsolationLevel.REPEATABLE_READ
            transaction = connection.transaction(force_rollback=not write)
            try:
                transaction.__enter__()
                return connection, transaction
            except psycopg.Error as error:
                connection.close()
                if fresh:
                    raise translate(error, f"store {self.location.masked!r}") from error

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(self._conninfo, autocommit=True, row_factory=dict_row)
        except psycopg.Error as error:
            raise translate(error, f"store {self.location.masked!r}") from error


class PipelinedTx(Tx):
    """A ``Tx`` that can switch its transaction to psycopg's pipeline mode (``batch``):
    statements whose results nobody reads yet are sent without waiting, and go to the server
    together with the next read, or with the ``COMMIT``. A hot transaction then costs a few
    round trips instead of one per statement -- what matters most while it holds the events
    table's lock, which every append waits for (docs/design.md §7.3)."""

    __slots__ = ("pipeline", "pipelining")

    def __init__(self, cursor: Any, dialect: Dialect) -> None:
        super().__init__(cursor, dialect)
        self.pipelining: AbstractContextManager[psycopg.Pipeline] | None = None
        self.pipeline: psycopg.Pipeline | None = None

    def batch(self) -> None:
        if self.pipelining is None:
            self.pipelining = self.cursor.connection.pipeline()
            self.pipeline = self.pipelining.__enter__()

    @property
    def batching(self) -> bool:
        return self.pipeline is not None

    @property
    def rowcount(self) -> int:
        """In pipeline mode a statement's row count is known only once its result came back,
        so the pipeline is synced first (a check of it must never see a stale count)."""
        if self.pipeline is not None:
            self.pipeline.sync()
        return int(self.cursor.rowcount)


class PostgresTransaction:
    """One transaction on a connection of ``PostgresConnections``; driver errors leave it as
    ``StoreError`` subclasses, and a connection that failed is never reused. A batched
    transaction's ``COMMIT`` goes out with its last queued statements, and the call returns
    only after the server answered them all (so an acknowledged write is committed)."""

    __slots__ = ("_connection", "_connections", "_dialect", "_transaction", "_tx", "_write")

    def __init__(self, connections: PostgresConnections, dialect: Dialect, write: bool) -> None:
        self._connections = connections
        self._dialect = dialect
        self._write = write

    def __enter__(self) -> Tx:
        self._connection, self._transaction = self._connections.begin(self._write)
        self._tx = PipelinedTx(self._connection.cursor(), self._dialect)
        return self._tx

    def __exit__(self, exc_type: Any, error: BaseException | None, traceback: Any) -> None:
        pipelining = self._tx.pipelining
        try:
            self._transaction.__exit__(exc_type, error, traceback)
            if pipelining is not None:  # sends the queued statements and the COMMIT, and waits
                pipelining.__exit__(exc_type, error, traceback)
        except BaseException as failure:
            self._finish_failed(failure)
        self._connections.release(self._connection)
        if error is not None and is_driver_error(error):
            raise translate(error, self._where()) from error

    def _finish_failed(self, error: BaseException) -> NoReturn:
        self._connection.close()
        self._connections.release(self._connection)
        if is_driver_error(error):
            raise translate(error, self._where()) from error
        raise error

    def _where(self) -> str:
        return f"store {self._dialect.location.masked!r}"


class PostgresRecorder(PostgresApplicationRecorder):
    """Like eventsourcing's, with the table lock first so commit order equals id order."""

    def __init__(self, datastore: PostgresDatastore, store: Store) -> None:
        super().__init__(datastore, events_table_name=f"{APPLICATION_NAME}_events")
        self.store = store
        # Rendered once: a composed statement is rendered again on every execution.
        self.insert_one_statement = (
            pgsql.SQL(
                "INSERT INTO {0}.{1} (originator_id, originator_version, topic, state) "
                "VALUES (%s, %s, %s, %s) RETURNING notification_id"
            )
            .format(
                pgsql.Identifier(self.datastore.schema), pgsql.Identifier(self.events_table_name)
            )
            .as_string(None)
        )
        self.notify_statement = (
            pgsql.SQL("NOTIFY {0}").format(pgsql.Identifier(self.channel_name)).as_string(None)
        )
        self.lock_statement = (
            pgsql.SQL("LOCK TABLE {0}.{1} IN EXCLUSIVE MODE")
            .format(
                pgsql.Identifier(self.datastore.schema), pgsql.Identifier(self.events_table_name)
            )
            .as_string(None)
        )

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> list[int]:
        """Append in one transaction, run again if the server is lost meanwhile: a deciding
        unit re-reads the log and decides again (an identical replay appends nothing), and a
        fixed batch whose commit went through collides with itself (``WriteConflict``, which
        the command's retry resolves by re-reading)."""
        return self.store.attempt(
            functools.partial(self._append, stored_events, kwargs.get("unit")), write=True
        )

    def _append(self, stored_events: Sequence[StoredEvent], unit: Any, tx: Tx) -> list[int]:
        tx.batch()  # the lock goes out with the log read; the rest with the COMMIT
        self.store.lock_log(tx)
        ids = append_in(tx, unit, stored_events, self._insert_one)
        if ids:
            tx.cursor.execute(self.notify_statement)
        return ids

    def _insert_one(self, tx: Tx, stored: StoredEvent) -> int:
        tx.cursor.execute(
            self.insert_one_statement,
            (stored.originator_id, stored.originator_version, stored.topic, stored.state),
        )
        return int(tx.cursor.fetchone()["notification_id"])


def conninfo(location: StoreLocation) -> str:
    """libpq's connection string: the URL's server, database and credentials only (procledger's
    own ``schema`` and ``retry_s`` parameters are not libpq's). ``synchronous_commit`` is on
    whatever the server's default: an acknowledged write must survive a server crash
    (``pg_ctl restart -m immediate`` lost acknowledged commits on a server that had it off).
    ``lock_timeout`` is 0 (wait for the events-table lock as long as it takes, as
    eventsourcing's own ``SET LOCAL`` before each lock said), whatever the server's default."""
    return make_conninfo(
        connect_timeout=CONNECT_TIMEOUT_S,
        options="-c synchronous_commit=on -c lock_timeout=0",
        **location.pg,
    )


class PostgresBackend(Backend):
    """A PostgreSQL schema, on connections of the store's own (``PostgresConnections``);
    eventsourcing's (small) pool only creates the events table and serves the recorder's own
    methods, which procledger itself does not call (docs/design.md §7.3)."""

    def __init__(self, location: StoreLocation, *, read_only: bool = False) -> None:
        super().__init__(location, read_only=read_only)
        self.dialect = PostgresDialect(location)
        self.connections = PostgresConnections(location)
        self.log_lock: Sequence[str] = ()
        """Statements that take the events table's write lock: appends then commit in
        notification-id order, so a feed reader never sees a later id first."""

    @classmethod
    def prepare(cls, location: StoreLocation, *, create: bool, read_only: bool = False) -> None:
        create_schema(location, create=create)

    def opening_lock(self) -> AbstractContextManager[object]:
        return schema_opening_lock(self.location)

    def infrastructure(self) -> PostgresFactory:
        """eventsourcing's factory, from an environment of its own (never os.environ)."""
        pg = self.location.pg
        env = {
            "POSTGRES_DBNAME": pg["dbname"],
            "POSTGRES_HOST": pg["host"],
            "POSTGRES_PORT": pg["port"],
            "POSTGRES_USER": pg["user"],
            "POSTGRES_PASSWORD": pg["password"],
            "POSTGRES_SCHEMA": self.location.schema,
            "POSTGRES_POOL_SIZE": "1",  # creates the tables; procledger's calls: its own
            "POSTGRES_MAX_OVERFLOW": "1",
            "POSTGRES_PRE_PING": "y",
            "POSTGRES_CONNECT_TIMEOUT": "5",
            "POSTGRES_IDLE_IN_TRANSACTION_SESSION_TIMEOUT": "0",
        }
        return PostgresFactory(Environment(APPLICATION_NAME, env))

    def recorder(self, datastore: Any, store: Store) -> PostgresRecorder:
        recorder = PostgresRecorder(datastore, store)
        # eventsourcing's lock statements are ``SET LOCAL lock_timeout`` (its default: 0, wait
        # as long as it takes) and the ``LOCK TABLE``; the timeout is the session's own here
        # (``conninfo``), so an append sends one statement for its lock, not two.
        self.log_lock = (recorder.lock_statement,)
        self.change_channel = recorder.channel_name
        return recorder

    def begin(self, write: bool) -> AbstractContextManager[Tx]:
        return PostgresTransaction(self.connections, self.dialect, write)

    def lock_log(self, tx: Tx) -> None:
        for statement in self.log_lock:
            tx.cursor.execute(statement)

    def change_listener(self) -> PostgresListener | None:
        if self.change_channel is None:
            return None
        return PostgresListener(self.location, self.change_channel)

    def close(self) -> None:
        self.connections.close()


class PostgresListener:
    """A connection of its own that LISTENs to the channel every append NOTIFYs in its write
    transaction (``PostgresRecorder._append``), so a follower learns of a commit by any
    process at once (docs/design.md §17). Its socket is readable when a notification came:
    an event loop waits for ``fileno()``, then calls ``drain()``, which never blocks."""

    def __init__(self, location: StoreLocation, channel: str) -> None:
        self._where = f"store {location.masked!r}"
        self._connection = _connect(location)
        try:
            self._connection.execute(pgsql.SQL("LISTEN {0}").format(pgsql.Identifier(channel)))
        except psycopg.Error as error:
            self._connection.close()
            raise translate(error, self._where) from error

    def fileno(self) -> int:
        """The connection's socket: readable when a notification (or anything) arrived."""
        return self._connection.fileno()

    def drain(self) -> bool:
        """Consume the notifications received so far; whether there were any."""
        try:
            return sum(1 for _ in self._connection.notifies(timeout=0)) > 0
        except psycopg.Error as error:
            raise translate(error, self._where) from error

    def close(self) -> None:
        """Close the connection (the server forgets the LISTEN with it)."""
        self._connection.close()


def _connect(location: StoreLocation) -> psycopg.Connection[Any]:
    """A side connection (opening only), waiting out a restarting server like a call does --
    and, once the wait has lasted ``SAY_WAITING_AFTER_S``, saying so once: the whole wait may
    be long (``retry_s``, 30 s by default) and, for a mistyped host or port, in vain."""
    first_failure: float | None = None
    said = False

    def connect() -> psycopg.Connection[Any]:
        nonlocal first_failure, said
        try:
            return psycopg.connect(conninfo(location), autocommit=True)
        except psycopg.Error as error:
            failure = translate(error, f"store URL {location.masked!r}: cannot connect")
            now = time.monotonic()
            first_failure = now if first_failure is None else first_failure
            if not said and now - first_failure >= SAY_WAITING_AFTER_S:
                said = True
                _logger.warning(
                    "%s; still retrying, for up to %g s in all (?retry_s=0 fails at once)",
                    failure,
                    location.retry_s,
                )
            raise failure from None

    return ride_through(location, connect)


@contextmanager
def schema_opening_lock(location: StoreLocation) -> Iterator[None]:
    """eventsourcing re-runs ``CREATE OR REPLACE FUNCTION`` on every open, and two processes
    doing that at once fail with "tuple concurrently updated". A session advisory lock, held on
    a side connection while the registry is constructed, makes concurrent opens wait instead.
    """
    with _connect(location) as conn:  # closing the connection releases the lock
        conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (f"procledger:{location.schema}",))
        yield


def create_schema(location: StoreLocation, *, create: bool = True) -> None:
    """Create the URL's schema if it is missing (racing creators are fine); with ``create``
    false a missing schema is a ``StoreURLError`` instead."""
    with _connect(location) as conn:
        if not create:
            found = conn.execute(
                "SELECT 1 FROM pg_namespace WHERE nspname = %s", (location.schema,)
            ).fetchone()
            if found is None:
                raise StoreURLError(
                    f"store URL {location.masked!r}: no ledger in schema {location.schema!r} "
                    "(nothing was created)"
                )
            return
        try:
            conn.execute(
                pgsql.SQL("CREATE SCHEMA IF NOT EXISTS {0}").format(
                    pgsql.Identifier(location.schema)
                )
            )
        except psycopg.errors.UniqueViolation:
            pass  # another process created it at the same moment
        except psycopg.Error as error:
            raise StoreError(f"store URL {location.masked!r}: {error}".strip()) from None
