"""Opening a store: the backend its URL names (chosen here, once), eventsourcing's
infrastructure for the events table, our own transactions for everything else, and -- for a
writer -- the schema step that creates or migrates the tables.

eventsourcing's factory makes the datastore (on PostgreSQL, a small pool) that creates the events
table; procledger composes these parts privately instead of inheriting ``Application``, whose
public methods would bypass our transactions.
"""

from __future__ import annotations

import shutil
from contextlib import suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from procledger.adapters.sql.errors import is_driver_error, translate
from procledger.adapters.sql.location import StoreLocation
from procledger.adapters.sql.schema import (
    SCHEMA_VERSION,
    check_known,
    ledger_name,
    migrate,
    stored_version,
)
from procledger.adapters.sql.store import Backend, Store, ride_through
from procledger.domain.errors import StoreError, StoreUnavailable, WriteConflict

_OPEN_ATTEMPTS = 3


@dataclass
class OpenedStore:
    """A store ready for transactions, and the recorder that appends to its events table."""

    store: Store
    recorder: Any
    factory: Any

    def close(self) -> None:
        self.factory.close()
        self.store.close()


def open_store(
    location: StoreLocation, *, create: bool = True, read_only: bool = False
) -> OpenedStore:
    """Open the store at ``location``. A writer's open (the default) creates or migrates the
    tables to this code's schema version; with ``create`` false it never creates a ledger (a
    missing SQLite file or PostgreSQL schema is a ``StoreURLError``). A ``read_only`` open
    creates nothing either, runs no DDL, takes no write lock and refuses writes -- except on a
    store with no ledger tables at all (an empty file or schema, ``memory://``), which gets them
    as before: there is nothing there to leave untouched (docs/design.md §7.1).

    Raises:
        StoreURLError: the location names nothing that can be opened.
        SchemaTooNew: a newer procledger migrated the ledger's tables.
        StoreUnavailable: the server or file cannot be reached now.
        StoreError: anything else that stops the store from opening, naming the URL.
    """
    backend = backend_class(location)
    try:
        backend.prepare(
            _first_reach(location, read_only), create=create and not read_only, read_only=read_only
        )
        return _open(backend, location, read_only=read_only)
    except StoreUnavailable as error:
        raise _said_why(location, error) from error.__cause__


def _first_reach(location: StoreLocation, read_only: bool) -> StoreLocation:
    """Where ``prepare`` first reaches the server: a writer rides through a server that is
    restarting for the URL's ``retry_s``, so that what it has to record is not lost; a reader
    (``ps``, ``show``, ``wait``...) has nothing to lose and a person waiting, so one attempt
    says at once that the server is not there -- a mistyped host or port fails in a moment, not
    after 30 s. Once the server answered, the reader's calls ride through like anyone's."""
    return replace(location, retry_s=0.0) if read_only else location


def backend_class(location: StoreLocation) -> type[Backend]:
    """The backend of ``location``'s database: the one place that asks which it is. The
    PostgreSQL one is imported only for ``postgresql://`` stores (psycopg is an extra: a
    missing driver is a one-line error saying what to install, not an ImportError)."""
    if location.dialect != "postgresql":
        from procledger.adapters.sql.sqlite import SQLiteBackend

        return SQLiteBackend
    try:
        from procledger.adapters.sql.postgres import PostgresBackend
    except ImportError as error:
        missing = (error.name or "psycopg").split(".")[0]
        raise StoreError(
            f"store URL {location.masked!r}: PostgreSQL support is not installed ({missing}): "
            "pip install 'procledger[postgres]'"
        ) from None
    return PostgresBackend


def _open(backend: type[Backend], location: StoreLocation, *, read_only: bool) -> OpenedStore:
    def open_once() -> OpenedStore:
        return _construct(backend, location, read_only=read_only)

    failure: StoreError | None = None
    for _ in range(_OPEN_ATTEMPTS):
        try:  # a server restarting meanwhile is ridden through, as by every call (§7.3)
            return ride_through(location, open_once)
        except WriteConflict as error:  # two processes creating the same tables at once
            failure = error
    raise StoreError(f"store URL {location.masked!r}: cannot open: {failure}")


NO_ROOM_BYTES = 1 << 20
"""Free space below which a SQLite file that cannot be opened is said to have no room."""


def _said_why(location: StoreLocation, error: StoreUnavailable) -> StoreUnavailable:
    """``error``, saying so when the SQLite file's folder has no room: SQLite then fails with
    a bare "disk I/O error" even to read, as it cannot make its shared-memory index."""
    if not location.sqlite_path or location.in_memory:
        return error
    folder = Path(location.sqlite_path).absolute().parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return error
    if free >= NO_ROOM_BYTES:
        return error
    return StoreUnavailable(
        f"{error} -- no space left on the device holding {folder} ({free} bytes free); "
        "SQLite needs room for its index files even to read"
    )


def _construct(
    backend_class: type[Backend], location: StoreLocation, *, read_only: bool
) -> OpenedStore:
    """The backend, eventsourcing's factory and our recorder, the schema step; whatever was
    opened is closed again if a later step fails (opening may be retried)."""
    where = f"store URL {location.masked!r}: cannot open"
    factory: Any = None
    backend: Backend | None = None
    try:
        backend = backend_class(location, read_only=read_only)
        factory = backend.infrastructure()
        store = Store(backend)
        recorder = backend.recorder(factory.datastore, store)
        _schema_step(store, recorder, read_only=read_only)
    except Exception as error:
        _close_quietly(factory, backend)
        if isinstance(error, StoreError):
            raise
        if is_driver_error(error):
            raise translate(error, where) from None
        raise StoreError(f"{where}: {error}") from None
    if read_only:
        store.refuse_writes()
    return OpenedStore(store, recorder, factory)


def _schema_step(store: Store, recorder: Any, *, read_only: bool) -> None:
    """Migrate the tables to this code's version -- a writer only, and only when they are
    older (a current ledger opens with one read), or a read-only open of a store with no
    ledger tables at all; refuse a newer ledger either way (docs/design.md §7.1)."""
    found = stored_version(store)
    check_known(store.location, found)
    if found == SCHEMA_VERSION or (read_only and found is not None):
        return
    if read_only and not store.backend.creates_tables_read_only:
        raise StoreError(
            f"ledger {ledger_name(store.location)}: it holds no ledger tables, and a read-only "
            "open creates none in a file that already holds data"
        )
    migrate(store, recorder.create_table)


def _close_quietly(factory: Any, backend: Backend | None) -> None:
    """Close a half-opened store; a failure to close adds nothing to the failure to open."""
    for part in (backend, factory):
        if part is not None:
            with suppress(Exception):
                part.close()
