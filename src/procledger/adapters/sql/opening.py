"""Opening a store: eventsourcing's infrastructure for the events table, our own transactions
for everything else, and the side tables.

eventsourcing's factory creates (and on PostgreSQL pools connections to) the events table and
picks our recorder classes by topic; procledger composes these parts privately instead of
inheriting ``Application``, whose public methods would bypass our transactions.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from eventsourcing.persistence import InfrastructureFactory
from eventsourcing.utils import Environment

from procledger.adapters.sql.dialect import APPLICATION_NAME
from procledger.adapters.sql.errors import is_driver_error, translate
from procledger.adapters.sql.location import StoreLocation
from procledger.adapters.sql.schema import create_tables
from procledger.adapters.sql.store import Store, ride_through
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


def open_store(location: StoreLocation, *, create: bool = True) -> OpenedStore:
    """Open (creating tables if needed) the store at ``location``; with ``create`` false,
    never create a ledger (a missing SQLite file or PostgreSQL schema is a ``StoreURLError``).

    Raises:
        StoreURLError: the location names nothing that can be opened.
        StoreUnavailable: the server or file cannot be reached now.
        StoreError: anything else that stops the store from opening, naming the URL.
    """
    try:
        _prepare(location, create=create)
        return _open(location)
    except StoreUnavailable as error:
        raise _said_why(location, error) from error.__cause__


def _open(location: StoreLocation) -> OpenedStore:
    def open_once() -> OpenedStore:
        with _opening_lock(location):
            return _construct(location)

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


def _construct(location: StoreLocation) -> OpenedStore:
    """eventsourcing's factory and recorder, our store on the same database, the tables;
    whatever was opened is closed again if a later step fails (opening may be retried)."""
    where = f"store URL {location.masked!r}: cannot open"
    factory: Any = None
    store: Store | None = None
    try:
        factory = InfrastructureFactory.construct(Environment(APPLICATION_NAME, _env(location)))
        recorder = factory.application_recorder()
        store = Store(location)
        _attach(store, recorder, cast(Any, factory).datastore)
        create_tables(store)
    except Exception as error:
        _close_quietly(factory, store)
        if isinstance(error, StoreError):
            raise
        if is_driver_error(error):
            raise translate(error, where) from None
        raise StoreError(f"{where}: {error}") from None
    return OpenedStore(store, recorder, factory)


def _close_quietly(factory: Any, store: Store | None) -> None:
    """Close a half-opened store; a failure to close adds nothing to the failure to open."""
    for part in (store, factory):
        if part is not None:
            with suppress(Exception):
                part.close()


def _env(location: StoreLocation) -> dict[str, str]:
    if location.dialect == "postgresql":
        env: dict[str, str] = _postgres(location).postgres_env(location)
        return env
    from procledger.adapters.sql.sqlite import sqlite_env

    return sqlite_env(location)


def _attach(store: Store, recorder: Any, datastore: Any) -> None:
    if store.location.dialect == "postgresql":
        _postgres(store.location).attach(store, recorder, datastore)
    else:
        from procledger.adapters.sql import sqlite

        sqlite.attach(store, recorder, datastore)


def _prepare(location: StoreLocation, *, create: bool) -> None:
    """Fail early, with the URL named, where eventsourcing would fail obscurely."""
    if location.dialect == "postgresql":
        _postgres(location).create_schema(location, create=create)
    elif not location.in_memory:
        from procledger.adapters.sql.sqlite import prepare_sqlite_file

        prepare_sqlite_file(location, create=create)


@contextmanager
def _opening_lock(location: StoreLocation) -> Iterator[None]:
    """Serialise opening one PostgreSQL schema across processes (a no-op for SQLite)."""
    if location.dialect != "postgresql":
        yield
        return
    with _postgres(location).schema_opening_lock(location):
        yield


def _postgres(location: StoreLocation) -> ModuleType:
    """The PostgreSQL adapter, imported only for ``postgresql://`` stores (psycopg is an extra:
    a missing driver is a one-line error saying what to install, not an ImportError)."""
    try:
        from procledger.adapters.sql import postgres
    except ImportError as error:
        missing = (error.name or "psycopg").split(".")[0]
        raise StoreError(
            f"store URL {location.masked!r}: PostgreSQL support is not installed ({missing}): "
            "pip install 'procledger[postgres]'"
        ) from None
    return postgres
