"""Opening and the schema version (docs/design.md §7.1, §7.2): a writer's open creates or
migrates the tables and records the version; a read-only open runs no DDL, takes no write lock
and refuses writes; a ledger of a newer version is refused either way.

(The 0.1.0 golden ledger's migration: ``tests/golden/test_golden_opening.py``.)
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from _shared import command_registration
from procledger import StoreError, StoreURLError, WriteConflict, open_registry
from procledger.adapters.sql import opening
from procledger.adapters.sql.errors import IntegrityConflict, is_driver_error
from procledger.adapters.sql.postgres import conninfo
from procledger.adapters.sql.schema import SCHEMA_VERSION
from procledger.domain.errors import SchemaTooNew


def no_migration(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any schema step from now on: an open that needs none must not take one."""

    def refused(*_: Any) -> None:
        raise AssertionError("the schema step ran")

    monkeypatch.setattr(opening, "migrate", refused)


def test_a_writers_open_records_the_version_and_later_opens_need_no_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ledger.db"
    open_registry(f"sqlite:///{path}").close()
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:
        row = connection.execute(
            "SELECT value FROM procledger_meta WHERE name='schema_version'"
        ).fetchone()
    connection.close()
    assert row == (SCHEMA_VERSION,)
    no_migration(monkeypatch)
    for read_only in (False, True):
        registry = open_registry(f"sqlite:///{path}", read_only=read_only)
        registry.close()


def test_a_read_only_open_of_a_missing_ledger_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(StoreURLError, match="no ledger"):
        open_registry(f"sqlite:///{tmp_path / 'missing.db'}", read_only=True)
    assert list(tmp_path.iterdir()) == []


def test_a_read_only_open_of_an_empty_file_reads_an_empty_ledger_as_before(
    tmp_path: Path,
) -> None:
    """An empty file is a ledger not written yet: it gets its tables even from a read-only
    open, as every open gave them before (there is nothing there to leave untouched)."""
    path = tmp_path / "empty.db"
    path.touch(mode=0o600)
    reads_and_refuses_writes(f"sqlite:///{path}")


def test_a_read_only_open_of_a_database_without_ledger_tables_creates_none(
    tmp_path: Path,
) -> None:
    """A file that already holds data is read through connections that only read: tables
    are made only in an empty one."""
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as other:
        other.execute("CREATE TABLE notes (text TEXT)")
    other.close()
    with pytest.raises(StoreError, match="holds no ledger tables"):
        open_registry(f"sqlite:///{path}", read_only=True)
    with sqlite3.connect(path) as other:
        tables = [row[0] for row in other.execute("SELECT name FROM sqlite_master")]
    other.close()
    assert tables == ["notes"]


def test_a_read_only_memory_store_reads_and_refuses_writes() -> None:
    reads_and_refuses_writes("memory://")


def reads_and_refuses_writes(url: str) -> None:
    """A read-only open of ``url``: an empty list read, a registration refused."""
    registry = open_registry(url, read_only=True)
    try:
        assert registry.list_processes({"status": "any"}) == []
        with pytest.raises(StoreError, match="read-only"):
            registry.register(command_registration("p"))
    finally:
        registry.close()


def test_a_duplicate_is_both_a_write_conflict_and_eventsourcings_integrity_error() -> None:
    """One class, caught by ``except WriteConflict`` (procledger's retry) and by ``except
    IntegrityError`` (eventsourcing's recorder contract); the domain never imports it."""
    from eventsourcing.persistence import IntegrityError

    mro = IntegrityConflict.__mro__
    assert mro.index(WriteConflict) < mro.index(IntegrityError)
    assert issubclass(IntegrityConflict, StoreError)
    for caught in (WriteConflict, IntegrityError, StoreError):
        with pytest.raises(caught):
            raise IntegrityConflict("store 'memory://': UNIQUE constraint failed")
    assert not is_driver_error(IntegrityConflict("translated already"))


@pytest.mark.postgres
def test_postgres_read_only_opens_run_no_schema_step_and_a_newer_schema_is_refused(
    postgres_schema_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = open_registry(postgres_schema_url)
    registry.register(command_registration("p"))
    location, schema = registry._store.location, registry._store.location.schema
    registry.close()
    with monkeypatch.context() as patched:
        no_migration(patched)
        for read_only in (True, False):
            registry = open_registry(postgres_schema_url, read_only=read_only)
            assert registry.get("p").id == "p"
            registry.close()
    with psycopg.connect(conninfo(location), autocommit=True) as admin:
        admin.execute(
            sql.SQL("UPDATE {}.procledger_meta SET value=%s WHERE name='schema_version'").format(
                sql.Identifier(schema)
            ),
            (SCHEMA_VERSION + 1,),
        )
    for read_only in (True, False):
        with pytest.raises(SchemaTooNew) as refused:
            open_registry(postgres_schema_url, read_only=read_only)
        assert schema in str(refused.value)
        assert (refused.value.found, refused.value.known) == (SCHEMA_VERSION + 1, SCHEMA_VERSION)
