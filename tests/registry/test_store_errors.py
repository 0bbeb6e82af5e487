"""Driver errors leave public methods as ``StoreError`` subclasses that say what the caller can
do (docs/design.md §9): ``StoreUnavailable`` (retry later), ``StoreCorrupt`` (damaged data,
naming the process), never a ``sqlite3``, ``psycopg`` or ``eventsourcing`` exception."""

from __future__ import annotations

import shutil
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import procledger.adapters.sql.sqlite as sqlite_adapter
from procledger import (
    ProcessRegistry,
    StoreCorrupt,
    StoreUnavailable,
    open_registry,
)
from procledger.adapters.sql import opening

from .conformance import registration


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.db"


@pytest.fixture
def impatient(ledger_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ProcessRegistry]:
    """A SQLite registry that waits 0.2 s (not a minute) for another writer's lock."""
    monkeypatch.setattr(sqlite_adapter, "LOCK_TIMEOUT_S", 0.2)
    registry = open_registry(f"sqlite:///{ledger_path}")
    yield registry
    registry.close()


def test_a_sqlite_file_locked_past_the_wait_is_unavailable_and_nothing_is_written(
    impatient: ProcessRegistry, ledger_path: Path
) -> None:
    holder = sqlite3.connect(ledger_path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreUnavailable, match="locked") as caught:
            impatient.register(registration("p"))
        assert str(ledger_path) in str(caught.value)
        assert not isinstance(caught.value, sqlite3.Error)
    finally:
        holder.rollback()
        holder.close()
    assert impatient.list_processes({"status": "any"}) == []
    impatient.register(registration("p"))  # the lock is gone: the same call succeeds


def test_a_corrupt_record_row_names_its_process_and_leaves_others_readable(
    impatient: ProcessRegistry, ledger_path: Path
) -> None:
    impatient.register(registration("good"))
    impatient.register(registration("bad"))
    with sqlite3.connect(ledger_path) as raw:
        raw.execute("UPDATE procledger_records SET record='{broken' WHERE process_id='bad'")
    with pytest.raises(StoreCorrupt, match="'bad'") as caught:
        impatient.get("bad")
    assert caught.value.process_id == "bad"
    assert impatient.get("good").id == "good"


def test_undecodable_text_in_a_row_is_corrupt_not_a_driver_error(
    impatient: ProcessRegistry, ledger_path: Path
) -> None:
    impatient.register(registration("p"))
    with sqlite3.connect(ledger_path) as raw:
        raw.execute(
            "UPDATE procledger_records SET record=CAST(X'7BFFFE7D' AS TEXT) WHERE process_id='p'"
        )
    with pytest.raises(StoreCorrupt):
        impatient.get("p")


def test_a_file_that_is_not_a_database_is_corrupt(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 200)
    with pytest.raises(StoreCorrupt, match=r"garbage\.db"):
        open_registry(f"sqlite:///{garbage}")


@pytest.mark.postgres
def test_connections_the_server_closed_cost_no_failed_call(postgres_schema_url: str) -> None:
    """Every pooled connection killed by the server (as a restart does): the next calls check
    their connection first and reconnect, so none fails (it used to be one failure per stale
    connection, as eventsourcing's ``OperationalError``)."""
    registry = open_registry(postgres_schema_url)
    try:
        registry.register(registration("p"))
        for _ in range(3):
            _terminate_other_backends(postgres_schema_url)
            assert registry.get("p").id == "p"
            registry.request_stop("p", "terminated")
            assert registry.list_processes()[0].id == "p"
    finally:
        registry.close()


def _terminate_other_backends(url: str) -> None:
    conninfo = url.split("?", maxsplit=1)[0]
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND usename = current_user"
        )


def test_memory_store_writers_and_a_log_reader_lose_nothing() -> None:
    """Two threads registering 300 processes each while a third follows the change feed."""
    registry = open_registry("memory://")
    failures: list[BaseException] = []
    done = threading.Event()

    def write(prefix: str) -> None:
        try:
            for n in range(300):
                registry.register(registration(f"{prefix}-{n}"))
        except BaseException as error:
            failures.append(error)

    def read() -> None:
        cursor = 0
        try:
            while not done.is_set():
                records, cursor = registry.changes_since(cursor, 50)
                for record in records:
                    registry.events(record.id)
        except BaseException as error:
            failures.append(error)

    writers = [threading.Thread(target=write, args=(p,)) for p in ("a", "b")]
    reader = threading.Thread(target=read)
    reader.start()
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join(timeout=120)
    done.set()
    reader.join(timeout=30)
    try:
        assert failures == []
        assert len(registry.list_processes({"status": "any"})) == 600
    finally:
        registry.close()


@pytest.mark.parametrize("free", [0, 10 << 30])
def test_a_sqlite_file_that_cannot_open_on_a_full_device_says_so(
    ledger_path: Path, monkeypatch: pytest.MonkeyPatch, free: int
) -> None:
    """On a full disk SQLite cannot make its index files, and opening fails with a bare "disk
    I/O error" even to read: the error says the device is full (a full device cannot be made
    here, so only the free space is faked; the failure to open is real, a lock past its wait:
    the ledger's version row is removed, as in a ledger from before versions were recorded, so
    the open must take the write lock for its schema step -- an open of a current ledger only
    reads, which a WAL file's writer does not block)."""
    open_registry(f"sqlite:///{ledger_path}").close()
    holder = sqlite3.connect(ledger_path)
    holder.execute("DELETE FROM procledger_meta WHERE name='schema_version'")
    holder.commit()
    holder.execute("BEGIN EXCLUSIVE")
    monkeypatch.setattr(sqlite_adapter, "LOCK_TIMEOUT_S", 0.2)
    usage = shutil.disk_usage(ledger_path.parent)
    monkeypatch.setattr(opening.shutil, "disk_usage", lambda path: usage._replace(free=free))
    try:
        with pytest.raises(StoreUnavailable) as raised:
            open_registry(f"sqlite:///{ledger_path}")
    finally:
        holder.rollback()
        holder.close()
    said = str(raised.value)
    assert said.startswith(f"store 'sqlite:///{ledger_path}': database is locked")
    full = f"no space left on the device holding {ledger_path.parent} (0 bytes free)"
    assert (full in said) is (free == 0), said
