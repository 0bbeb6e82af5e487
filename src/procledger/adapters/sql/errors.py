"""Driver errors become procledger's own.

A caller can act on three things: try again later (``StoreUnavailable``), give up on damaged
data (``StoreCorrupt``), or retry a write that lost a race (``WriteConflict``, retried by the
commands themselves). Every exception of sqlite3, psycopg and eventsourcing's persistence layer
is sorted into one of those (or plain ``StoreError``) here, and only here.
"""

from __future__ import annotations

import sqlite3
import sys
from typing import Any

from eventsourcing import persistence as es

from procledger.adapters.sql.sqlite_files import sqlite_error
from procledger.domain.errors import (
    ProcledgerError,
    StoreCorrupt,
    StoreError,
    StoreUnavailable,
    WriteConflict,
)


class IntegrityConflict(WriteConflict, es.IntegrityError):
    """A row the database refused as a duplicate -- above all an event at a ``(stream,
    version)`` already taken: procledger's ``WriteConflict`` (which its commands retry,
    docs/design.md §3.7) and eventsourcing's ``IntegrityError`` (what eventsourcing's recorder
    contract says a duplicate append raises), so code written against either catches it. It
    lives here, not in the domain, because the domain does not import eventsourcing."""


def is_driver_error(error: BaseException) -> bool:
    """Whether ``error`` comes from a database driver (or eventsourcing's wrapping of one);
    never one of procledger's own errors, which are translated already (``IntegrityConflict``
    is also an eventsourcing error)."""
    if isinstance(error, ProcledgerError):
        return False
    if isinstance(
        error,
        sqlite3.Error | es.PersistenceError | es.ConnectionPoolClosedError | UnicodeDecodeError,
    ):
        return True
    psycopg = sys.modules.get("psycopg")  # loaded only for PostgreSQL stores
    return psycopg is not None and isinstance(error, psycopg.Error)


def translate(error: BaseException, where: str) -> StoreError:
    """The ``StoreError`` subclass for a driver error; ``where`` names the store."""
    message = f"{where}: {_first_line(error)}"
    if isinstance(error, sqlite3.IntegrityError | es.IntegrityError):
        return IntegrityConflict(message)
    if isinstance(error, UnicodeDecodeError):
        return StoreCorrupt(f"{where}: undecodable text in a stored row: {error}")
    if isinstance(error, sqlite3.Error):
        return sqlite_error(error, message)
    return _postgres(error, message)


_CONFIGURATION_SQLSTATES = ("28", "3D")
"""Invalid authorization, unknown database: waiting will not help — fix the URL."""
_CONFIGURATION_MESSAGES = (
    "does not exist",  # database or role (a refused connection carries no SQLSTATE)
    "authentication failed",
    "no pg_hba.conf entry",
)


def _sqlstate(error: BaseException) -> str:
    """The server's SQLSTATE of a psycopg error (or of the one eventsourcing wrapped)."""
    for candidate in (error, error.__cause__):
        state = getattr(candidate, "sqlstate", None)
        if isinstance(state, str):
            return state
    return ""


def _postgres(error: BaseException, message: str) -> StoreError:
    psycopg: Any = sys.modules.get("psycopg")
    text = str(error).lower()
    if _sqlstate(error)[:2] in _CONFIGURATION_SQLSTATES or any(
        marker in text for marker in _CONFIGURATION_MESSAGES
    ):
        return StoreError(message)
    if isinstance(error, es.OperationalError | es.InterfaceError):
        return StoreUnavailable(message)
    if isinstance(error, es.DataError):
        return StoreCorrupt(message)
    if psycopg is not None:
        if isinstance(error, psycopg.errors.IntegrityError):
            return IntegrityConflict(message)
        if isinstance(error, psycopg.OperationalError | psycopg.InterfaceError):
            return StoreUnavailable(message)
        if isinstance(error, psycopg.DataError):
            return StoreCorrupt(message)
    if isinstance(error, es.ConnectionPoolClosedError):
        return StoreUnavailable(message)
    return StoreError(message)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
