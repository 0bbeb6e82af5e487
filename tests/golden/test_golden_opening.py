"""Opening the 0.1.0 ledger: a read-only open writes nothing; a writer's open migrates it.

The 0.1.0 ledger has no recorded schema version (no ledger had one before versions were
recorded), so it reads as version 0. A read-only open -- the read commands' -- runs no DDL and
takes no write lock: the file keeps its bytes and its mtime. A writer's open migrates it to the
current version and records that version (docs/design.md §7.1, §7.2). Each test works on a copy.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from _shared import command_registration
from procledger import ProcessRegistry, StoreError, open_registry
from procledger.adapters.sql.schema import SCHEMA_VERSION
from procledger.domain.errors import SchemaTooNew

LEDGER = Path(__file__).resolve().parent / "ledger-0.1.0.db"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    ledger = tmp_path / "ledger-0.1.0.db"
    shutil.copyfile(LEDGER, ledger)
    ledger.chmod(0o600)
    return ledger


def url_of(path: Path) -> str:
    return f"sqlite:///{path}"


def untouched(path: Path) -> tuple[str, int, list[str]]:
    """What must not change: the file's bytes, its mtime, and the folder's files (no -wal,
    -shm or -journal file left beside it)."""
    return sha256(path), path.stat().st_mtime_ns, sorted(p.name for p in path.parent.iterdir())


def recorded_version(path: Path) -> object:
    """The ``schema_version`` row, read with sqlite3 itself (read-only), or ``None``."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
        if "procledger_meta" not in tables:
            return None
        row = connection.execute(
            "SELECT value FROM procledger_meta WHERE name='schema_version'"
        ).fetchone()
    return None if row is None else row[0]


def read_everything(registry: ProcessRegistry) -> int:
    """Read what the read commands read: the listing, each record and its events, the feed."""
    records = registry.list_processes({"status": "any"}, limit=1000)
    for record in records:
        registry.get(record.id)
        registry.events(record.id)
    registry.changes_since(0, limit=1000)
    return len(records)


def test_a_read_only_open_writes_nothing(copy: Path) -> None:
    before = untouched(copy)
    registry = open_registry(url_of(copy), read_only=True)
    try:
        assert read_everything(registry) > 0
        with pytest.raises(StoreError, match="read-only"):
            registry.register(command_registration("refused"))
    finally:
        registry.close()
    assert untouched(copy) == before
    assert recorded_version(copy) is None


def test_the_read_commands_write_nothing(copy: Path) -> None:
    before = untouched(copy)
    for argv in (["ps", "--all"], ["show", "done-exited-0"], ["feed"]):
        done = subprocess.run(
            [sys.executable, "-m", "procledger", "--url", url_of(copy), *argv],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PROCLEDGER_URL": ""},
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout
    assert untouched(copy) == before


def test_a_writers_open_migrates_it_and_records_the_version(copy: Path) -> None:
    registry = open_registry(url_of(copy), create=False)
    try:
        assert read_everything(registry) > 0
        registry.register(command_registration("after-migration"))
    finally:
        registry.close()
    assert recorded_version(copy) == SCHEMA_VERSION
    before = untouched(copy)
    registry = open_registry(url_of(copy), read_only=True)
    try:
        assert registry.get("after-migration").id == "after-migration"
    finally:
        registry.close()
    assert untouched(copy) == before


@pytest.mark.parametrize("read_only", [True, False])
def test_a_newer_schema_is_refused_naming_the_ledger_and_both_versions(
    copy: Path, read_only: bool
) -> None:
    open_registry(url_of(copy)).close()
    newer = SCHEMA_VERSION + 1
    with sqlite3.connect(copy) as connection:
        connection.execute(
            "UPDATE procledger_meta SET value=? WHERE name='schema_version'", (newer,)
        )
    connection.close()
    before = untouched(copy)
    with pytest.raises(SchemaTooNew) as refused:
        open_registry(url_of(copy), read_only=read_only)
    message = str(refused.value)
    assert str(copy) in message
    assert f"version is {newer}" in message
    assert f"version {SCHEMA_VERSION}," in message
    assert (refused.value.found, refused.value.known) == (newer, SCHEMA_VERSION)
    assert untouched(copy) == before
