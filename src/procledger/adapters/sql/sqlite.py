"""The SQLite backend (``SQLiteBackend``, a file or ``memory://``): connections held by the
store, transactions as plain context managers, and the recorder that appends events with their
side effects (docs/design.md §7.3)."""

from __future__ import annotations

import math
import os
import sqlite3
import threading
import uuid
import weakref
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from types import TracebackType
from typing import Any

from eventsourcing.persistence import StoredEvent
from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteDatastore, SQLiteFactory
from eventsourcing.utils import Environment

from procledger.adapters.sql.dialect import APPLICATION_NAME, Dialect
from procledger.adapters.sql.errors import translate
from procledger.adapters.sql.group_commit import Group, WriteGroups
from procledger.adapters.sql.location import StoreLocation
from procledger.adapters.sql.sqlite_files import (
    connect_read_only,
    damaged_file,
    is_damage,
    leave_mark,
    refuse_if_damaged,
    why_not_writable,
)
from procledger.adapters.sql.sqlite_paths import check_ledger_file
from procledger.adapters.sql.store import Backend, Store, Tx, append_in
from procledger.domain.errors import StoreError, StoreReadOnly

LOCK_TIMEOUT_S = 60
"""How long a writer waits for another to commit before the store is ``StoreUnavailable``."""


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

    def __init__(
        self, database: str, *, in_memory: bool, timeout: float, read_only: bool = False
    ) -> None:
        self.database = database
        self.timeout = timeout
        self.read_only = read_only
        """Whether connections only read (``connect_read_only``): those of a read-only open."""
        self._serialised: threading.RLock | None = threading.RLock() if in_memory else None
        self._idle: list[sqlite3.Connection] = []
        self._closed = False
        self.groups = (
            None if in_memory else WriteGroups(self.acquire, self.release, timeout=timeout)
        )
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

    def serialised(self) -> AbstractContextManager[object]:
        """The lock every transaction of an in-memory store takes (nothing for a file): held
        also by the recorder methods eventsourcing implements, which read on connections of
        eventsourcing's pool -- a shared-cache database fails them ("database table is
        locked") when they meet a write in progress instead of waiting for it."""
        return self._serialised if self._serialised is not None else nullcontext()

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
        if self.groups is not None:
            self.groups.forget_after_fork()

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
        options: dict[str, Any] = {
            "check_same_thread": False,
            "isolation_level": None,
            "cached_statements": 256,
            "timeout": self.timeout,
        }
        if self.read_only:
            connection = connect_read_only(self.database, **options)
        else:
            try:
                connection = sqlite3.connect(self.database, uri=True, **options)
            except sqlite3.Error as error:
                raise translate(error, "cannot open the SQLite database") from error
        connection.row_factory = sqlite3.Row
        return connection


_OPEN_STORES: weakref.WeakSet[SQLiteConnections] = weakref.WeakSet()


def _forget_parents_connections() -> None:
    for connections in list(_OPEN_STORES):
        connections.forget_after_fork()


os.register_at_fork(after_in_child=_forget_parents_connections)


class _TranslatedExit:
    """The way out of a transaction, for both kinds below: the kind's own ending (``_end``),
    then a driver error raised inside the ``with`` block leaves it as a ``StoreError``
    subclass (docs/design.md §9)."""

    __slots__ = ()
    _dialect: Dialect

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._end(error)
        if isinstance(error, sqlite3.Error | UnicodeDecodeError):
            raise _translated(error, self._dialect) from error

    def _end(self, error: BaseException | None) -> None:
        raise NotImplementedError


class SQLiteTransaction(_TranslatedExit):
    """One SQLite transaction as a plain context manager (a generator-based one costs a few
    microseconds per layer, and this runs once per command). Driver errors leave it as
    ``StoreError`` subclasses."""

    __slots__ = ("_connection", "_connections", "_cursor", "_dialect", "_write")

    def __init__(self, connections: SQLiteConnections, dialect: Dialect, write: bool) -> None:
        self._connections = connections
        self._dialect = dialect
        self._write = write

    def __enter__(self) -> Tx:
        self._connection = connection = self._connections.acquire()
        try:
            self._cursor = cursor = connection.cursor()
            cursor.execute("BEGIN IMMEDIATE" if self._write else "BEGIN")
        except BaseException as error:
            self._connections.release(connection)
            if isinstance(error, sqlite3.Error):
                raise _translated(error, self._dialect) from error
            raise
        return Tx(cursor, self._dialect)

    def _end(self, error: BaseException | None) -> None:
        try:
            self._finish(error)
        except sqlite3.Error as failure:
            raise _translated(failure, self._dialect) from failure

    def _finish(self, error: BaseException | None) -> None:
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


class GroupedWrite(_TranslatedExit):
    """One write transaction on a SQLite file, as a member of a group commit (``WriteGroups``):
    it returns once the group's commit -- this write's included -- is durable."""

    __slots__ = ("_cursor", "_dialect", "_group", "_groups")
    _group: Group
    _cursor: sqlite3.Cursor

    def __init__(self, groups: WriteGroups, dialect: Dialect) -> None:
        self._groups = groups
        self._dialect = dialect

    def __enter__(self) -> Tx:
        try:
            self._group, self._cursor = self._groups.join()
        except sqlite3.Error as error:
            raise _translated(error, self._dialect) from error
        return Tx(self._cursor, self._dialect)

    def _end(self, error: BaseException | None) -> None:
        failure = self._groups.leave(self._group, self._cursor, error)
        if isinstance(failure, sqlite3.Error):
            raise _translated(failure, self._dialect) from failure
        if failure is not None:
            raise StoreError(
                f"{_where(self._dialect)}: the transaction this write shared was rolled back "
                f"({type(failure).__name__}: {failure})"
            ) from failure


class SQLiteRecorder(SQLiteApplicationRecorder):
    """Appends events and runs the write unit's side effects in one transaction of the
    store's own; the methods eventsourcing implements (its reads, creating the events table)
    take the store's lock where every transaction does (``memory://``)."""

    def __init__(
        self, datastore: SQLiteDatastore, store: Store, connections: SQLiteConnections
    ) -> None:
        super().__init__(datastore)
        self.store = store
        self.connections = connections

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

    def create_table(self) -> None:
        with self.connections.serialised():
            super().create_table()

    def select_events(self, *args: Any, **kwargs: Any) -> Any:
        with self.connections.serialised():
            return super().select_events(*args, **kwargs)

    def select_notifications(self, *args: Any, **kwargs: Any) -> Any:
        with self.connections.serialised():
            return super().select_notifications(*args, **kwargs)

    def max_notification_id(self) -> Any:
        with self.connections.serialised():
            return super().max_notification_id()


class SQLiteBackend(Backend):
    """A SQLite file, or a private shared-cache in-memory database (``memory://``), on
    connections of the store's own (docs/design.md §7.3): a write on a file joins this
    process's group commit; an in-memory store serialises its transactions on one lock."""

    def __init__(self, location: StoreLocation, *, read_only: bool = False) -> None:
        super().__init__(location, read_only=read_only)
        self.dialect = Dialect(location)
        self.database = (
            f"file:procledger-{uuid.uuid4().hex}?mode=memory&cache=shared"
            if location.in_memory
            else location.sqlite_path
        )
        self.connections = SQLiteConnections(
            self.database,
            in_memory=location.in_memory,
            timeout=LOCK_TIMEOUT_S,
            # An empty file is a ledger not written yet: it gets its tables (docs/design.md §7.1).
            read_only=read_only and not location.in_memory and not _is_empty(location),
        )

    @property
    def creates_tables_read_only(self) -> bool:
        return not self.connections.read_only

    @classmethod
    def prepare(cls, location: StoreLocation, *, create: bool, read_only: bool = False) -> None:
        if not location.in_memory:
            prepare_sqlite_file(location, create=create, read_only=read_only)

    def infrastructure(self) -> SQLiteFactory:
        return SQLiteFactory(
            Environment(
                APPLICATION_NAME,
                {
                    "SQLITE_DBNAME": self.database,
                    "SQLITE_LOCK_TIMEOUT": str(math.ceil(LOCK_TIMEOUT_S)),
                },
            )
        )

    def recorder(self, datastore: Any, store: Store) -> SQLiteRecorder:
        return SQLiteRecorder(datastore, store, self.connections)

    def begin(self, write: bool) -> AbstractContextManager[Tx]:
        """A transaction: a write on a file joins this process's group commit."""
        if write and self.connections.groups is not None:
            return GroupedWrite(self.connections.groups, self.dialect)
        return SQLiteTransaction(self.connections, self.dialect, write)

    def close(self) -> None:
        self.connections.close()


def prepare_sqlite_file(location: StoreLocation, *, create: bool, read_only: bool = False) -> None:
    """Fail early, with the URL named, where eventsourcing would fail obscurely; create the
    ledger file (``0600``, and for the default ledger its folder, ``0700``) only when
    ``create`` — otherwise a missing file is a ``StoreURLError`` naming the path. A writer is
    refused (``StoreReadOnly``) where SQLite could not write; a reader's first connection
    (``connect_read_only``) is its check."""
    path = Path(location.sqlite_path)
    check_ledger_file(location, path, create=create)
    if read_only:
        return
    why = why_not_writable(path)
    if why is not None:
        raise StoreReadOnly(
            f"store URL {location.masked!r}: the ledger cannot be written here: {why}. A "
            "writer needs its folder too (SQLite makes the -wal and -shm files beside it); "
            "read commands (ps, show, verify) still work. Make the folder writable, or copy "
            "it somewhere writable"
        )
    try:
        refuse_if_damaged(path)
    except sqlite3.Error as error:
        raise translate(error, f"store URL {location.masked!r}: cannot open") from None


def _is_empty(location: StoreLocation) -> bool:
    """Whether the ledger file is empty (or gone: its open will say so)."""
    try:
        return os.path.getsize(location.sqlite_path) == 0
    except OSError:
        return False


def _translated(error: BaseException, dialect: Dialect) -> StoreError:
    """A driver error met in a transaction, as a ``StoreError`` naming the store; a damaged
    file (a malformed page) says so, with the way forward, and is marked so that the next
    writer's open checks it whatever its size (docs/design.md §7.3, "Damaged files")."""
    location = dialect.location
    if location.sqlite_path and not location.in_memory and is_damage(error):
        lines = str(error).strip().splitlines()
        detail = f"SQLite: {lines[0] if lines else type(error).__name__}"
        leave_mark(location.sqlite_path, detail)
        return damaged_file(location.sqlite_path, detail)
    return translate(error, _where(dialect))


def _where(dialect: Dialect) -> str:
    """How an error names the store (its URL with the password masked)."""
    return f"store {dialect.location.masked!r}"
