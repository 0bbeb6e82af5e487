"""The registry conformance suite on a SQLite file."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from _stores import SQLiteCase
from procledger import CompletionAuthority, open_registry

from .conformance import RegistryConformance, registration

AUTHORITY = CompletionAuthority.workflow_key("test")


class TestSQLiteRegistry(SQLiteCase, RegistryConformance):
    pass


def test_sqlite_ledger_survives_reopening(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    first = open_registry(url)
    try:
        first.register(registration("kept"))
        first.record_started("kept", 5)
        record = first.get("kept")
    finally:
        first.close()
    second = open_registry(url)
    try:
        assert second.get("kept") == record
        assert [e.kind for e in second.events("kept")] == ["registered", "started"]
    finally:
        second.close()


def test_relative_sqlite_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rel").mkdir()
    registry = open_registry("sqlite:///rel/ledger.db")
    try:
        registry.register(registration("r"))
    finally:
        registry.close()
    assert (tmp_path / "rel" / "ledger.db").exists()


def _flags(path: Path) -> dict[str, tuple[int, str]]:
    with closing(sqlite3.connect(path)) as db:
        rows = db.execute("SELECT process_id, terminal, status FROM procledger_records").fetchall()
    return {str(process_id): (int(terminal), str(status)) for process_id, terminal, status in rows}


def test_records_terminal_and_status_columns_follow_the_state(tmp_path: Path) -> None:
    """A going write leaves ``terminal`` and ``status`` out of its update; both columns are
    still right after each write, and a row damaged to say otherwise is put right by the next
    going write."""
    path = tmp_path / "ledger.db"
    registry = open_registry(f"sqlite:///{path}")
    try:
        for pid in ("a", "b", "c"):
            registry.register(registration(pid))
        registry.record_started("a", 1)
        assert _flags(path) == {"a": (0, "running"), "b": (0, "running"), "c": (0, "running")}
        with closing(sqlite3.connect(path)) as db, db:
            db.execute("UPDATE procledger_records SET terminal=1 WHERE process_id='b'")
            db.execute("UPDATE procledger_records SET status='failed' WHERE process_id='c'")
        registry.record_started("b", 1)
        registry.record_started("c", 1)
        assert _flags(path) == {"a": (0, "running"), "b": (0, "running"), "c": (0, "running")}
        registry.record_completed("a", "exited", "exited", exit_code=1, authority=AUTHORITY)
        assert _flags(path)["a"] == (1, "failed")
    finally:
        registry.close()
