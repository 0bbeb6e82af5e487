"""Opening the ledger for a hot command: on the fast path a SQLite file read-only with the
standard library; otherwise -- PostgreSQL, ``memory://``, or whatever the fast path declines --
the registry, read-only (docs/design.md §8.1).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from procledger.adapters.sql.dialect import Dialect
from procledger.adapters.sql.location import StoreLocation, locate, store_key
from procledger.adapters.sql.schema import SCHEMA_VERSION, version_in
from procledger.adapters.sql.sqlite_paths import check_ledger_file
from procledger.adapters.sql.store import Tx
from procledger.application.document_reads import LedgerReads, NeedsFullPath

__all__ = ["open_reads", "reading"]

_BUSY_MS = 5_000
"""How long a read waits on a writer's lock (a checkpoint) before it is an error."""


@contextmanager
def reading(url: str | None, *, fast: bool) -> Iterator[LedgerReads]:
    """``open_reads``, closed after the block."""
    reads = open_reads(url, fast=fast)
    try:
        yield reads
    finally:
        reads.close()


def open_reads(url: str | None, *, fast: bool) -> LedgerReads:
    """The ledger ``url`` names (``$PROCLEDGER_URL``, else the default), opened to read.
    Raises what opening the registry raises (a missing ledger is a ``StoreURLError``), or
    ``NeedsFullPath`` when the fast path cannot read it faithfully."""
    location = locate(url)
    if fast and location.dialect == "sqlite" and not location.in_memory:
        return _sqlite_reads(location)
    if fast and location.dialect == "postgresql":
        from procledger.cli.hot.agent_reads import agent_reads

        return agent_reads(store_key(location) or "")
    if fast:
        raise NeedsFullPath
    return _registry_reads(url, location)


def _sqlite_reads(location: StoreLocation) -> LedgerReads:
    path = Path(location.sqlite_path)
    check_ledger_file(location, path, create=False)
    try:
        connection = sqlite3.connect(
            f"file:{quote(str(path.absolute()))}?mode=ro", uri=True, isolation_level=None
        )
    except sqlite3.Error:
        raise NeedsFullPath from None
    connection.row_factory = sqlite3.Row
    connection.execute(f"PRAGMA busy_timeout={_BUSY_MS}")
    tx = Tx(connection.cursor(), Dialect(location))

    def run(read: Any) -> Any:
        try:
            return read(tx)
        except sqlite3.Error:  # busy, damaged, an older schema: the registry says what it is
            raise NeedsFullPath from None

    if run(version_in) != SCHEMA_VERSION:
        connection.close()
        raise NeedsFullPath
    return LedgerReads(run, store_key=store_key(location) or "", close=connection.close)


def _registry_reads(url: str | None, location: StoreLocation) -> LedgerReads:
    from procledger import open_registry

    registry = open_registry(url, create=False, read_only=True)
    key = store_key(location) or ""
    return LedgerReads(registry.run_read, store_key=key, close=registry.close, registry=registry)
