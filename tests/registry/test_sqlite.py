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


def _terminal_flags(path: Path) -> dict[str, int]:
    with closing(sqlite3.connect(path)) as db:
        rows = db.execute("SELECT process_id, terminal FROM procledger_records").fetchall()
    return {str(process_id): int(terminal) for process_id, terminal in rows}


def test_records_terminal_flag_follows_the_state(tmp_path: Path) -> None:
    """A going write leaves ``terminal`` out of its update; the flag is still right after each
    write, and a row whose flag was damaged to 1 is put right by the next going write."""
    path = tmp_path / "ledger.db"
    registry = open_registry(f"sqlite:///{path}")
    try:
        for pid in ("a", "b"):
            registry.register(registration(pid))
        registry.record_started("a", 1)
        assert _terminal_flags(path) == {"a": 0, "b": 0}
        with closing(sqlite3.connect(path)) as db, db:
            db.execute("UPDATE procledger_records SET terminal=1 WHERE process_id='b'")
        registry.record_started("b", 1)
        assert _terminal_flags(path) == {"a": 0, "b": 0}
        registry.record_completed("a", "exited", "exited", exit_code=0, authority=AUTHORITY)
        assert _terminal_flags(path) == {"a": 1, "b": 0}
    finally:
        registry.close()
