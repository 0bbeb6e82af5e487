"""Damage stays local (issue 13, docs/design.md §5 and §9): one corrupt read-model row or one
undecodable event affects its own process only. Lists, handles and the change feed leave it
out and name it; ``get`` of it raises ``StoreCorrupt`` naming it; ``rebuild`` rebuilds
everything else and reports what it could not; ``procledger rebuild`` exits 1 naming it."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from _shared import run_cli
from procledger import ProcessRegistry, StoreCorrupt, open_registry
from registry.conformance import registration

IDS = ("a-good", "b-bad", "c-good")
T = TypeVar("T")


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.db"


@pytest.fixture
def registry_url(path: Path) -> str:
    return f"sqlite:///{path}"


@pytest.fixture
def registry(registry: ProcessRegistry) -> ProcessRegistry:
    """The shared ``registry`` on this file, with ``IDS`` registered and granted."""
    for process_id in IDS:
        registry.register(registration(process_id))
        registry.grant_handle("s", process_id)
    return registry


def damage_record(path: Path, process_id: str, record: bytes) -> None:
    with sqlite3.connect(path) as raw:
        raw.execute(
            "UPDATE procledger_records SET record=CAST(? AS TEXT) WHERE process_id=?",
            (record, process_id),
        )
    raw.close()


def damage_event(path: Path, version: int, state: bytes) -> None:
    """Replace the state of the ``b-bad`` process's event at ``version``."""
    from procledger.domain.process import process_uuid

    with sqlite3.connect(path) as raw:
        raw.execute(
            "UPDATE stored_events SET state=? WHERE originator_id=? AND originator_version=?",
            (state, process_uuid("b-bad").hex, version),
        )
    raw.close()


@pytest.mark.parametrize(
    "record", [b"{broken", b"\x7b\xff\xfe\x7d", b'{"id": "b-bad"}'], ids=["json", "utf8", "shape"]
)
def test_a_damaged_record_row_is_left_out_and_named_and_the_others_are_listed(
    registry: ProcessRegistry, path: Path, record: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    damage_record(path, "b-bad", record)
    scan = registry.scan_processes({"status": "any"})
    assert [r.id for r in scan.records] == ["a-good", "c-good"]
    assert scan.damaged == ["b-bad"]
    with caplog.at_level(logging.WARNING, logger="procledger.store"):
        assert [r.id for r in registry.list_processes()] == ["a-good", "c-good"]
    assert "'b-bad'" in caplog.text  # a skip is never silent
    with pytest.raises(StoreCorrupt, match="'b-bad'") as caught:
        registry.get("b-bad")
    assert caught.value.process_id == "b-bad"
    assert [h.process_id for h in registry.handles("s")] == ["a-good", "c-good"]
    assert registry.get("c-good").id == "c-good"


def test_the_feed_passes_a_damaged_record_and_names_it(
    registry: ProcessRegistry, path: Path
) -> None:
    damage_record(path, "b-bad", b"{broken")
    page = registry.scan_changes(0, 10)
    assert [r.id for r in page.records] == ["a-good", "c-good"]
    assert page.damaged == ["b-bad"]
    assert page.cursor.value == registry.get("c-good").change_seq
    first = registry.scan_changes(0, 2)  # a page ending on the damaged row still advances
    assert [r.id for r in first.records] == ["a-good"]
    assert first.damaged == ["b-bad"]
    records, cursor = registry.changes_since(first.cursor, 10)
    assert [r.id for r in records] == ["c-good"]
    assert cursor == page.cursor


@pytest.mark.parametrize("change_seq", ["garbage", b"\xff\xfe"], ids=["text", "blob"])
def test_the_feed_names_a_row_whose_change_seq_is_damaged(
    registry: ProcessRegistry, path: Path, change_seq: str | bytes
) -> None:
    """Text or a BLOB sorts after every number: the row is named, never made the cursor."""
    with sqlite3.connect(path) as raw:
        raw.execute(
            "UPDATE procledger_records SET change_seq=? WHERE process_id='b-bad'", (change_seq,)
        )
    raw.close()
    page = registry.scan_changes(0, 10)
    assert [r.id for r in page.records] == ["a-good", "c-good"]
    assert page.damaged == ["b-bad"]
    assert page.cursor.value == registry.get("c-good").change_seq
    assert registry.changes_since(page.cursor, 10) == ([], page.cursor)


def test_rebuild_repairs_a_damaged_record_row(registry: ProcessRegistry, path: Path) -> None:
    before = registry.get("b-bad")
    damage_record(path, "b-bad", b"{broken")
    report = registry.rebuild()
    assert report.damaged == []
    assert registry.get("b-bad") == before


def test_an_undecodable_event_spoils_its_own_process_only(
    registry: ProcessRegistry, path: Path
) -> None:
    registry.record_started("b-bad", 1)
    registry.record_started("c-good", 1)
    kept = registry.get("b-bad")
    damage_event(path, 2, b"\xff not json")
    with sqlite3.connect(path) as raw:  # the read models are lost too: rebuild must restore
        raw.execute("DELETE FROM procledger_records WHERE process_id <> 'b-bad'")
    raw.close()
    report = registry.rebuild()
    assert report.damaged == ["b-bad"]
    assert report.marked == ["b-bad"]  # the damaged bytes break its chain: marked, not kept
    assert report.applied > 0
    scan = registry.scan_processes({"status": "any"})
    assert [r.id for r in scan.records] == ["a-good", "c-good"]
    assert scan.damaged == ["b-bad"]
    with pytest.raises(StoreCorrupt, match=r"'b-bad'.*does not verify.*procledger verify"):
        registry.get("b-bad")  # its old row is not served either: it was marked
    assert kept.id == "b-bad"
    assert registry.get("c-good").state.value == "running"
    with pytest.raises(StoreCorrupt, match="'b-bad'"):
        registry.events("b-bad")
    assert [e.kind for e in registry.events("c-good")] == ["registered", "started"]


def test_procledger_rebuild_exits_1_naming_what_it_could_not_rebuild(
    registry: ProcessRegistry, path: Path
) -> None:
    damage_event(path, 1, b"{not json")
    registry.close()
    result = run_cli("rebuild", url=f"sqlite:///{path}")
    assert result.returncode == 1, result
    assert "b-bad" in result.stderr or "stream" in result.stderr
    assert "Traceback" not in result.stderr
    healthy = run_cli("rebuild", url=f"sqlite:///{path.parent / 'fresh.db'}")
    assert healthy.returncode == 1  # a ledger that does not exist is not created
    assert not (path.parent / "fresh.db").exists()


def test_a_damaged_stream_id_is_reported_not_a_value_error(
    registry: ProcessRegistry, path: Path
) -> None:
    from procledger.domain.process import process_uuid

    with sqlite3.connect(path) as raw:
        raw.execute(
            "UPDATE stored_events SET originator_id='not-a-uuid' WHERE originator_id=?",
            (process_uuid("b-bad").hex,),
        )
    raw.close()
    report = registry.rebuild()
    assert report.damaged == ["stream not-a-uuid"]
    assert [r.id for r in registry.list_processes({"status": "any"})] == ["a-good", "c-good"]


def test_a_stored_event_with_an_unknown_state_is_corrupt_not_a_key_error(
    registry: ProcessRegistry, path: Path
) -> None:
    from procledger.domain.process import process_uuid

    registry.record_started("b-bad", 1)
    with sqlite3.connect(path) as raw:
        (state,) = raw.execute(
            "SELECT state FROM stored_events WHERE originator_id=? AND originator_version=2",
            (process_uuid("b-bad").hex,),
        ).fetchone()
    raw.close()
    damage_event(path, 2, state.replace(b'"running"', b'"no-such-state"'))
    reopened = open_registry(f"sqlite:///{path}")  # no reusable copy of the aggregate
    try:
        with pytest.raises(StoreCorrupt, match="'b-bad'"):
            reopened.request_stop("b-bad", "terminated")
        assert reopened.rebuild().damaged == ["b-bad"]
        reopened.request_stop("c-good", "terminated")  # the others are unaffected
    finally:
        reopened.close()


def _within(seconds: float, call: Callable[[], T]) -> T:
    """``call()`` in a daemon thread, failing (not hanging) if it has not returned in time."""
    outcome: list[T] = []
    worker = threading.Thread(target=lambda: outcome.append(call()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still running after {seconds} s"
    assert outcome, "it raised (see the thread's traceback above)"
    return outcome[0]


def test_rebuild_ends_and_drops_a_record_row_whose_id_is_a_blob(
    registry: ProcessRegistry, path: Path
) -> None:
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE procledger_records SET process_id=X'FFFE' WHERE process_id='b-bad'")
    raw.close()
    assert not registry.verify().ok
    report = _within(60, registry.rebuild)
    assert report.damaged == []
    assert [r.id for r in registry.list_processes({"status": "any"})] == list(IDS)
    assert registry.verify().ok  # the row no log backs is gone, b-bad's is rebuilt


def test_verify_reports_a_head_row_with_a_damaged_version(
    registry: ProcessRegistry, path: Path
) -> None:
    registry.record_started("b-bad", 1)
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE procledger_heads SET version='garbage' WHERE process_id='b-bad'")
    raw.close()
    report = registry.verify()
    assert report.failed == ["b-bad"]
    [problem] = report.problems
    assert (problem.check, problem.process_id) == ("head", "b-bad")
    assert "'garbage'" in problem.detail


@pytest.mark.parametrize(
    ("column", "value", "detail"),
    [
        ("originator_id", "garbage", "stream id is damaged ('garbage')"),
        ("originator_version", None, "event row"),
        ("state", "garbage", "state of type str"),
        ("state", 2**62, "state of type int"),
        ("state", None, "state of type NoneType"),
    ],
)
def test_verify_reports_a_damaged_event_row(
    registry: ProcessRegistry, path: Path, column: str, value: object, detail: str
) -> None:
    """A column of ``stored_events`` holding what procledger never writes is a ``log``
    problem in the report, not an exception out of ``verify``."""
    registry.record_started("b-bad", 1)
    damage_event_column(path, column, value)
    report = registry.verify()
    assert not report.ok
    assert any(p.check == "log" and detail in p.detail for p in report.problems), report.problems
    assert "b-bad" in report.failed


def test_events_of_a_damaged_version_is_corrupt_naming_the_process(
    registry: ProcessRegistry, path: Path
) -> None:
    registry.record_started("b-bad", 1)
    damage_event_column(path, "originator_version", "garbage")
    with pytest.raises(StoreCorrupt, match=r"'b-bad'.*version is damaged \('garbage'\)"):
        registry.events("b-bad")
    assert [e.kind for e in registry.events("c-good")] == ["registered"]


def damage_event_column(path: Path, column: str, value: object) -> None:
    """Set ``column`` of the ``b-bad`` process's second event to ``value``."""
    from procledger.domain.process import process_uuid

    with sqlite3.connect(path) as raw:
        raw.execute(
            f"UPDATE stored_events SET {column}=? WHERE originator_id=? AND originator_version=2",
            (value, process_uuid("b-bad").hex),
        )
    raw.close()


def test_verify_reports_a_damaged_chain_tracking_row(registry: ProcessRegistry, path: Path) -> None:
    from procledger.adapters.sql.head_rows import CHAIN_TRACKING

    with sqlite3.connect(path) as raw:
        raw.execute(
            "UPDATE procledger_tracking SET position='garbage' WHERE name=?", (CHAIN_TRACKING,)
        )
    raw.close()
    report = registry.verify()
    assert [(p.check, p.process_id) for p in report.problems] == [("chain", None)]
    assert "'garbage'" in report.problems[0].detail


@pytest.mark.parametrize(
    ("stored", "damaged"),
    [
        # A BLOB sorts after every text in SQLite: paging ``id > last`` must not find it for ever.
        ("X'FFFE'", "stream \ufffd\ufffd"),
        # It used to fail the whole rebuild with a ``TypeError`` (``bytes(None)``).
        ("NULL", "stream NULL"),
    ],
)
def test_rebuild_ends_on_a_stream_id_that_is_no_text_and_names_it(
    registry: ProcessRegistry, path: Path, stored: str, damaged: str
) -> None:
    from procledger.domain.process import process_uuid

    with sqlite3.connect(path) as raw:
        raw.execute(
            f"UPDATE stored_events SET originator_id={stored} WHERE originator_id=?",
            (process_uuid("b-bad").hex,),
        )
    raw.close()
    report = _within(60, registry.rebuild)
    assert report.damaged == [damaged]
    assert [r.id for r in registry.list_processes({"status": "any"})] == ["a-good", "c-good"]


NOT_UTF8 = "CAST(X'73686132353680ff' AS TEXT)"
"""Text whose bytes are not UTF-8 (``sha256`` and two stray bytes): what a SQLite file may
hold in any text column."""


@pytest.mark.parametrize(
    ("statement", "check"),
    [
        (f"UPDATE procledger_heads SET digest={NOT_UTF8} WHERE process_id='b-bad'", "head"),
        (f"UPDATE procledger_records SET record={NOT_UTF8} WHERE process_id='b-bad'", "read_model"),
        (
            f"UPDATE procledger_records SET identity_label={NOT_UTF8} WHERE process_id='b-bad'",
            "read_model",
        ),
        (f"UPDATE procledger_grants SET descriptor={NOT_UTF8} WHERE process_id='b-bad'", "grants"),
        (f"UPDATE stored_events SET topic={NOT_UTF8} WHERE originator_id=:key AND ", "log"),
    ],
    ids=["head-digest", "record", "record-label", "grant", "event-topic"],
)
def test_one_byte_that_is_not_utf8_names_its_process_and_verify_goes_on(
    registry: ProcessRegistry, path: Path, statement: str, check: str
) -> None:
    """It used to fail the whole verify ("Could not decode to UTF-8 column 'digest'")."""
    from procledger.domain.process import process_uuid

    registry.record_started("b-bad", 1)
    if statement.endswith("AND "):
        statement += "originator_version=2"
    with sqlite3.connect(path) as raw:
        raw.execute(statement, {"key": process_uuid("b-bad").hex})
    raw.close()
    report = registry.verify()
    assert report.failed == ["b-bad"], report.problems
    assert check in {p.check for p in report.problems}, report.problems
    assert report.processes == 3


def test_an_env_row_that_is_not_utf8_is_named_and_verify_goes_on(
    registry: ProcessRegistry, path: Path
) -> None:
    env_ref = registry.store_env({"A": "1"})
    with sqlite3.connect(path) as raw:
        raw.execute(f"UPDATE procledger_envs SET env={NOT_UTF8}")
    raw.close()
    report = registry.verify()
    assert [(p.check, p.process_id) for p in report.problems] == [("env", None)]
    assert env_ref in report.problems[0].detail


def test_procledger_verify_names_a_process_whose_head_is_not_utf8(
    registry: ProcessRegistry, path: Path
) -> None:
    with sqlite3.connect(path) as raw:
        raw.execute(f"UPDATE procledger_heads SET digest={NOT_UTF8} WHERE process_id='b-bad'")
    raw.close()
    registry.close()
    result = run_cli("verify", url=f"sqlite:///{path}")
    assert result.returncode == 1, result
    assert "FAILED process 'b-bad': head:" in result.stdout
    assert "a-good" not in result.stdout
    assert "Traceback" not in result.stderr
