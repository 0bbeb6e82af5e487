"""A ledger read with nothing but the standard library: a SQLite file opened read-only with
``sqlite3`` as the backend opens it for a reader (``sqlite_files.connect_read_only``: a folder
nobody may write included), its statements run on a ``Tx`` with the same SQL as the store's
(docs/design.md §8.1). The CLI's hot commands read this way; whatever it cannot read
faithfully -- another database, an older schema, a SQLite error -- is ``NeedsFullPath``, raised
before anything is printed, and the registry reads it instead.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from procledger.adapters.sql.dialect import Dialect
from procledger.adapters.sql.location import StoreLocation
from procledger.adapters.sql.schema import SCHEMA_VERSION, version_in
from procledger.adapters.sql.sqlite_files import connect_read_only
from procledger.adapters.sql.sqlite_paths import check_ledger_file
from procledger.adapters.sql.store import Tx
from procledger.domain.errors import ProcledgerError

__all__ = ["NeedsFullPath", "Runner", "is_shared", "plain_reads"]

Runner = Callable[[Callable[[Tx], Any]], Any]
"""Runs one read function in a read transaction and returns what it returned."""

_BUSY_MS = 5_000
"""How long a read waits on a writer's lock (a checkpoint) before it is an error."""


class NeedsFullPath(Exception):
    """What a plain read met only the full stack reads faithfully (another database, an older
    schema, an event of an older shape, a damaged row): read it through the registry."""


def is_shared(location: StoreLocation) -> bool:
    """Whether the ledger is a server's (PostgreSQL): one this host's agent may hold open."""
    return location.dialect == "postgresql"


def plain_reads(location: StoreLocation) -> tuple[Runner, Callable[[], None]]:
    """A runner of read functions over ``location``'s SQLite file, opened read-only, and what
    closes it. Raises ``StoreURLError`` as the backend does (no file, a folder) and
    ``NeedsFullPath`` for anything else it cannot read."""
    if location.dialect != "sqlite" or location.in_memory:
        raise NeedsFullPath
    path = Path(location.sqlite_path)
    check_ledger_file(location, path, create=False)
    try:
        connection = connect_read_only(path, isolation_level=None)
    except (ProcledgerError, sqlite3.Error):  # the registry's open says why, in its words
        raise NeedsFullPath from None
    connection.row_factory = sqlite3.Row
    tx = Tx(connection.cursor(), Dialect(location))

    def run(read: Callable[[Tx], Any]) -> Any:
        try:
            return read(tx)
        except sqlite3.Error:  # busy, damaged: the registry says what it is
            raise NeedsFullPath from None

    try:
        connection.execute(f"PRAGMA busy_timeout={_BUSY_MS}")
        if run(version_in) != SCHEMA_VERSION:
            raise NeedsFullPath
    except BaseException:
        connection.close()
        raise
    return run, connection.close
