"""Every SQLite driver error leaves a public method as a ``StoreError`` subclass naming the
ledger (issue 13, docs/design.md §9): a full disk and a lock held past the wait are
``StoreUnavailable``, a malformed file and undecodable text are ``StoreCorrupt`` — never a
``sqlite3`` exception."""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import procledger.adapters.sql.sqlite as sqlite_adapter
from _shared import fill_up, small_tmpfs
from procledger import (
    ProcledgerError,
    StoreCorrupt,
    StoreError,
    StoreUnavailable,
    open_registry,
)
from registry.conformance import registration


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (root only), unmounted afterwards."""
    with small_tmpfs(tmp_path / "tiny", "1m") as mount:
        yield mount


def test_a_full_disk_is_unavailable_and_the_same_call_succeeds_once_there_is_room(
    tiny_disk: Path,
) -> None:
    path = tiny_disk / "ledger.db"
    registry = open_registry(f"sqlite:///{path}")
    try:
        registry.register(registration("before"))
        filler = fill_up(tiny_disk / "filler")
        big = {"blob": "x" * 200_000}  # more than any page the file may still have free
        failures = []
        for index in range(20):
            try:
                registry.register(registration(f"full-{index}", definition=big))
            except ProcledgerError as error:
                failures.append(error)
                break
        assert len(failures) == 1, "the disk never filled"
        assert isinstance(failures[0], StoreUnavailable), repr(failures[0])
        assert "ledger.db" in str(failures[0])
        assert registry.get("before").id == "before"  # reads still work
        filler.unlink()
        registry.register(registration("after", definition=big))
        assert registry.get("after").id == "after"
    finally:
        registry.close()


def _corrupt_pages(path: Path) -> None:
    """Overwrite every page but the first (the header and schema) with garbage."""
    size = path.stat().st_size
    with path.open("r+b") as raw:
        raw.seek(4096)
        raw.write(os.urandom(size - 4096))


def test_a_malformed_database_file_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    registry = open_registry(f"sqlite:///{path}")
    for index in range(200):
        registry.register(registration(f"p{index:03d}", definition={"pad": "y" * 200}))
    registry.close()  # the last connection checkpoints the WAL into the file
    _corrupt_pages(path)
    try:
        reopened = open_registry(f"sqlite:///{path}")
    except StoreCorrupt as error:
        opened_error: StoreCorrupt | None = error
    else:
        opened_error = None
    if opened_error is not None:
        assert "ledger.db" in str(opened_error)
        return
    try:
        for call in (
            lambda: reopened.list_processes({"status": "any"}),
            lambda: reopened.get("p100"),
            lambda: reopened.register(registration("new")),
            reopened.rebuild,
        ):
            with pytest.raises(ProcledgerError) as caught:
                call()
            assert isinstance(caught.value, StoreError)
            assert not isinstance(caught.value, sqlite3.Error)
        with pytest.raises(StoreCorrupt, match="malformed"):
            reopened.list_processes({"status": "any"})
    finally:
        reopened.close()


def test_undecodable_utf8_in_an_event_row_is_corrupt_naming_the_process(tmp_path: Path) -> None:
    from procledger.domain.process import process_uuid

    path = tmp_path / "ledger.db"
    registry = open_registry(f"sqlite:///{path}")
    try:
        registry.register(registration("p"))
        with sqlite3.connect(path) as raw:
            raw.execute(
                "UPDATE stored_events SET topic=CAST(X'70726FFF' AS TEXT) WHERE originator_id=?",
                (process_uuid("p").hex,),
            )
        raw.close()
        with pytest.raises(StoreCorrupt):
            registry.events("p")
        with pytest.raises(StoreError):
            registry.request_stop("p", "terminated")
        report = registry.rebuild()
        assert report.damaged == ["p"]  # named through its record
        assert report.marked == ["p"]  # its changed bytes break its chain
        with pytest.raises(StoreCorrupt, match=r"'p'.*does not verify"):
            registry.get("p")
    finally:
        registry.close()


def test_a_lock_held_past_the_wait_is_unavailable_naming_the_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_adapter, "LOCK_TIMEOUT_S", 0.2)
    path = tmp_path / "ledger.db"
    registry = open_registry(f"sqlite:///{path}")
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        for call in (
            lambda: registry.register(registration("p")),
            registry.rebuild,
            lambda: registry.store_env({"A": "1"}),
        ):
            with pytest.raises(StoreUnavailable, match=r"ledger\.db"):
                call()
    finally:
        holder.rollback()
        holder.close()
        registry.close()


def test_a_ledger_file_replaced_by_garbage_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    open_registry(f"sqlite:///{path}").close()
    path.write_bytes(uuid.uuid4().bytes * 1000)
    with pytest.raises(StoreCorrupt, match=r"ledger\.db"):
        open_registry(f"sqlite:///{path}")
