"""The registry conformance suite on a SQLite file."""

from __future__ import annotations

from pathlib import Path

import pytest

from _stores import SQLiteCase
from procledger import open_registry

from .conformance import RegistryConformance, registration


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
