"""A SQLite ledger file with bytes overwritten in the middle (docs/design.md §7.3, "Damaged
files"): a writer's open refuses it with ``StoreCorrupt`` naming the file and the way forward;
reads serve what they can; ``verify`` reports what it could read and what it could not, per
process and per table and page; ``rebuild`` does not write into it.

Before: ``procledger run -- true`` kept writing into such a file without a word, and ``ps
--all``, ``verify`` and ``rebuild`` each stopped at the first bad page with SQLite's bare
"database disk image is malformed". The damage here is a real write into the file: two pages
(one of the log, one of the records table) overwritten with bytes that are no page.
"""

from __future__ import annotations

import hashlib
import logging
import random
import sqlite3
from pathlib import Path

import pytest

from _shared import run_cli
from procledger import ProcessRegistry, StoreCorrupt, open_registry
from procledger.adapters.sql import sqlite_files
from registry.conformance import registration

COUNT = 120


def ledger(path: Path) -> None:
    """``COUNT`` processes with padded definitions (so the log spans many pages), started;
    closed, so the log is checkpointed into the file."""
    registry = open_registry(f"sqlite:///{path}")
    try:
        for index in range(COUNT):
            process_id = f"p{index:03d}"
            registry.register(registration(process_id, definition={"pad": "x" * 300}))
            registry.record_started(process_id, 1)
    finally:
        registry.close()


def middle_leaf(path: Path, table: str) -> int:
    """A leaf page of ``table`` from the middle of its pages."""
    with sqlite3.connect(path) as raw:
        pages = [
            row[0]
            for row in raw.execute(
                "SELECT pageno FROM dbstat WHERE name=? AND pagetype='leaf' ORDER BY pageno",
                (table,),
            )
        ]
        (size,) = raw.execute("PRAGMA page_size").fetchone()
    raw.close()
    assert len(pages) > 2, pages
    return int(pages[len(pages) // 2]) * 1_000_000 + int(size)


def overwrite_page(path: Path, table: str, seed: int) -> None:
    """Overwrite one leaf page of ``table`` in the file itself with bytes that are no page."""
    found = middle_leaf(path, table)
    page, size = divmod(found, 1_000_000)
    with path.open("r+b") as file:
        file.seek((page - 1) * size)
        file.write(random.Random(seed).randbytes(size))


@pytest.fixture
def damaged(tmp_path: Path) -> Path:
    path = tmp_path / "ledger.db"
    ledger(path)
    overwrite_page(path, "stored_events", 1)
    overwrite_page(path, "procledger_records", 2)
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_writers_open_refuses_it_naming_the_file_and_the_way_forward(damaged: Path) -> None:
    before = digest(damaged)
    for create in (True, False):
        with pytest.raises(StoreCorrupt) as refused:
            open_registry(f"sqlite:///{damaged}", create=create)
        message = str(refused.value)
        assert str(damaged) in message
        assert "a writer does not open it" in message
        assert "procledger verify" in message
        assert ".recover" in message
        assert refused.value.file == str(damaged)
    assert digest(damaged) == before  # nothing was written
    assert Path(f"{damaged}-damaged").exists()


def test_run_refuses_it_in_one_line_and_writes_nothing(damaged: Path) -> None:
    before = digest(damaged)
    result = run_cli("run", "--", "true", url=f"sqlite:///{damaged}")
    assert result.returncode == 1, result
    assert result.stderr.count("\n") == 1, result.stderr
    assert "is damaged" in result.stderr
    assert str(damaged) in result.stderr
    assert "procledger verify" in result.stderr
    assert digest(damaged) == before


def test_reads_serve_what_they_can(damaged: Path, caplog: pytest.LogCaptureFixture) -> None:
    registry = open_registry(f"sqlite:///{damaged}", read_only=True)
    try:
        with caplog.at_level(logging.WARNING, logger="procledger.store"):
            scan = registry.scan_processes({"status": "any"})
        listed = [record.id for record in scan.records]
        assert 0 < len(listed) + len(scan.damaged) < COUNT  # a page of records is lost
        assert len(listed) > COUNT // 2
        assert "is damaged: listed what can still be read" in caplog.text
        assert "procledger_records" in caplog.text
        assert registry.get(listed[0]).id == listed[0]  # a record on a sound page
    finally:
        registry.close()
    result = run_cli("ps", "--all", url=f"sqlite:///{damaged}")
    assert result.returncode == 0, result.stderr
    assert "listed what can still be read" in result.stderr
    assert len(result.stdout.splitlines()) > COUNT // 2


def test_a_page_of_a_list_is_read_around_the_damage_as_the_plain_read_pages(
    damaged: Path,
) -> None:
    registry = open_registry(f"sqlite:///{damaged}", read_only=True)
    try:
        every = [r.id for r in registry.scan_processes({"status": "any"}).records]
        newest = registry.scan_processes({"status": "any"}, limit=5, newest_first=True)
        assert [r.id for r in newest.records] == every[::-1][:5]
        after = registry.scan_processes({"status": "any"}, limit=3, after=every[10])
        assert [r.id for r in after.records] == every[11:14]
        running = registry.scan_processes({"status": "running"})  # a filter, read around it
        assert [r.id for r in running.records] == every
    finally:
        registry.close()


def test_verify_says_what_it_could_read_and_what_not(damaged: Path) -> None:
    registry = open_registry(f"sqlite:///{damaged}", read_only=True)
    try:
        report = registry.verify()
    finally:
        registry.close()
    assert not report.ok
    assert report.database == "damaged"
    details = [p.detail for p in report.problems if p.check == "database"]
    assert any(d.startswith("table stored_events: damaged page(s)") for d in details), details
    assert any(d.startswith("table procledger_records: damaged page(s)") for d in details)
    assert any("of stored_events from rowid" in d and "could not be read" in d for d in details)
    # Per process: those whose events or record lay on the lost pages, and only those.
    assert 0 < len(report.failed) < COUNT // 2, report.failed
    assert report.processes >= COUNT - len(report.failed)
    assert all(
        "unreadable (the file is damaged)" in p.detail
        for p in report.problems
        if p.process_id is not None
    ), report.problems
    result = run_cli("verify", url=f"sqlite:///{damaged}")
    assert result.returncode == 1
    assert "database: damaged" in result.stdout
    assert "FAILED process" in result.stdout
    assert "Traceback" not in result.stderr


def test_rebuild_is_refused_in_one_line(damaged: Path) -> None:
    result = run_cli("rebuild", url=f"sqlite:///{damaged}")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert "is damaged" in result.stderr
    assert "procledger verify" in result.stderr
    assert "a writer does not open it" in result.stderr
    assert "rebuild" in result.stderr


def test_a_file_too_large_to_check_at_each_open_is_marked_by_its_first_error(
    damaged: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``CHECKED_BYTES`` a writer's open checks nothing, until an error said the file
    is damaged: the mark left then makes every later writer's open check it."""
    monkeypatch.setattr(sqlite_files, "CHECKED_BYTES", 0)
    mark = Path(f"{damaged}-damaged")
    registry = open_registry(f"sqlite:///{damaged}")  # not checked: it opens
    try:
        assert not mark.exists()
        with pytest.raises(StoreCorrupt, match="the rebuild stopped there") as stopped:
            registry.rebuild()
        assert stopped.value.file == str(damaged)
        assert mark.exists()
    finally:
        registry.close()
    with pytest.raises(StoreCorrupt, match="a writer does not open it"):
        open_registry(f"sqlite:///{damaged}")


def test_a_sound_file_behind_a_mark_opens_and_loses_the_mark(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    ledger(path)
    mark = Path(f"{path}-damaged")
    mark.write_text("an earlier copy was damaged\n")
    open_registry(f"sqlite:///{path}").close()
    assert not mark.exists()


def test_a_healthy_writers_open_checks_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ledger.db"
    ledger(path)
    checks: list[str] = []
    real = sqlite_files._problems

    def counted(connection: sqlite3.Connection, *, always: bool) -> list[str]:
        checks.append("checked")
        return real(connection, always=always)

    monkeypatch.setattr(sqlite_files, "_problems", counted)
    open_registry(f"sqlite:///{path}").close()
    open_registry(f"sqlite:///{path}", read_only=True).close()
    assert checks == ["checked"]  # the writer's open; a reader's checks nothing


def test_the_registry_of_a_reader_is_not_refused(damaged: Path) -> None:
    registry: ProcessRegistry = open_registry(f"sqlite:///{damaged}", read_only=True)
    registry.close()
