"""``verify`` (docs/design.md §13.3) names each process whose log was tampered with or damaged,
and passes on a clean ledger and on the 0.1.0 golden ledger (whose processes predate hash
chains: ``unchained``, not a failure). Before it, an edited argv or exit code was accepted and
``rebuild`` spread it."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from _shared import run_cli
from procledger import ProcessInput, ProcessRegistry, open_registry
from procledger.application.verify import VerifyReport
from registry.conformance import KEY, registration

from ._raw import Raw

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "ledger-0.1.0.db"


def _ledger(registry: ProcessRegistry) -> None:
    """Three finished processes and one running, with a grant: the bystanders of each test."""
    for name in ("a", "b", "c"):
        registry.register(registration(name, input=ProcessInput.command(["true"])))
        registry.record_started(name, 1)
        registry.record_completed(name, "exited", "exited", exit_code=0, authority=KEY)
    registry.register(registration("running"))
    registry.record_started("running", 1)
    registry.grant_handle("s", "running")


def _failed(report: VerifyReport, process_id: str, check: str) -> None:
    assert not report.ok
    assert report.failed == [process_id], report.problems
    assert check in {p.check for p in report.problems if p.process_id == process_id}


@pytest.fixture
def ledger(registry: ProcessRegistry, url: str) -> tuple[ProcessRegistry, Raw]:
    _ledger(registry)
    assert registry.verify().ok
    raw = Raw(url)
    yield registry, raw  # type: ignore[misc]
    raw.close()


def test_a_clean_ledger_verifies(ledger: tuple[ProcessRegistry, Raw]) -> None:
    report = ledger[0].verify()
    assert report.ok
    assert report.problems == []
    assert report.unchained == []
    assert report.processes == 4
    assert report.database in {"ok", "not checked"}


def test_an_edited_argv_is_named(ledger: tuple[ProcessRegistry, Raw]) -> None:
    registry, raw = ledger
    raw.replace_in_state("b", 1, b'"argv":["true"]', b'"argv":["evil"]')
    _failed(registry.verify(), "b", "registration")


def test_an_edited_argv_with_a_recomputed_hash_still_breaks_the_chain(
    ledger: tuple[ProcessRegistry, Raw],
) -> None:
    registry, raw = ledger
    state = orjson.loads(raw.state("b", 1))
    state["registration"]["input"]["argv"] = ["evil"]
    from procledger.domain.registration import registration_hash_of

    state["registration_hash"] = registration_hash_of(state["registration"])
    raw.set_state("b", 1, orjson.dumps(state))
    _failed(registry.verify(), "b", "chain")


def test_an_edited_exit_code_is_named(ledger: tuple[ProcessRegistry, Raw]) -> None:
    registry, raw = ledger
    raw.replace_in_state("c", 3, b'"exit_code":0', b'"exit_code":7')
    report = registry.verify()
    _failed(report, "c", "chain")
    assert any("v3" in p.detail for p in report.problems)


def test_a_deleted_middle_event_is_named(ledger: tuple[ProcessRegistry, Raw]) -> None:
    registry, raw = ledger
    raw.delete_event("a", 2)
    _failed(registry.verify(), "a", "log")


def test_a_deleted_last_event_is_named(ledger: tuple[ProcessRegistry, Raw]) -> None:
    registry, raw = ledger
    raw.delete_event("a", 3)
    report = registry.verify()
    _failed(report, "a", "log")
    assert any("v3" in p.detail for p in report.problems)


def test_a_deleted_process_log_is_named(ledger: tuple[ProcessRegistry, Raw]) -> None:
    registry, raw = ledger
    raw.run(f"DELETE FROM {raw.events} WHERE originator_id=?", (raw.key("a"),))
    _failed(registry.verify(), "a", "log")


def test_a_damaged_record_row_is_named(ledger: tuple[ProcessRegistry, Raw]) -> None:
    registry, raw = ledger
    raw.run(f"UPDATE {raw.table('records')} SET record='{{not json' WHERE process_id='b'")
    _failed(registry.verify(), "b", "read_model")


def test_a_record_row_that_differs_from_a_rebuild_is_named(
    ledger: tuple[ProcessRegistry, Raw],
) -> None:
    registry, raw = ledger
    raw.run(f"UPDATE {raw.table('records')} SET status='failed' WHERE process_id='c'")
    _failed(registry.verify(), "c", "read_model")


def test_an_undecodable_event_is_named(ledger: tuple[ProcessRegistry, Raw]) -> None:
    registry, raw = ledger
    raw.set_state("running", 2, b"\xff\xfe not json")
    report = registry.verify()
    assert report.failed == ["running"], report.problems


def test_a_damaged_grant_is_named(ledger: tuple[ProcessRegistry, Raw]) -> None:
    registry, raw = ledger
    raw.run(f"DELETE FROM {raw.table('grants')} WHERE process_id='running'")
    _failed(registry.verify(), "running", "grants")


def test_verify_writes_nothing(ledger: tuple[ProcessRegistry, Raw]) -> None:
    registry, raw = ledger
    raw.run(f"UPDATE {raw.table('records')} SET status='failed' WHERE process_id='c'")
    tables = ["records", "grants", "heads", "leases", "tracking"]
    before = {t: sorted(raw.run(f"SELECT * FROM {raw.table(t)}")) for t in tables}
    events = raw.run(f"SELECT COUNT(*) FROM {raw.events}")
    assert not registry.verify().ok
    assert {t: sorted(raw.run(f"SELECT * FROM {raw.table(t)}")) for t in tables} == before
    assert raw.run(f"SELECT COUNT(*) FROM {raw.events}") == events


# -- the golden ledger and the command line ---------------------------------------------------


def test_a_copy_of_the_golden_ledger_verifies_as_unchained_and_new_writes_chain(
    tmp_path: Path,
) -> None:
    copy = tmp_path / "golden.db"
    shutil.copyfile(GOLDEN, copy)
    registry = open_registry(f"sqlite:///{copy}")
    try:
        report = registry.verify()
        assert report.ok, report.problems
        assert report.processes == len(report.unchained) > 0
        running = registry.get("run-main")
        assert not running.state.is_terminal
        registry.request_stop("run-main", "terminated")  # a new event on an old process
        registry.register(registration("after-upgrade"))
        report = registry.verify()
        assert report.ok, report.problems
        assert "run-main" in report.unchained
        assert "after-upgrade" not in report.unchained
        stopped = len(registry.events("run-main"))  # the new event's version
        raw = Raw(f"sqlite:///{copy}")
        try:  # an old process's new event is chained to its unchained predecessor
            raw.replace_in_state("run-main", stopped - 1, b'"at_ms"', b'"at_ms" ')
        finally:
            raw.close()
        _failed(registry.verify(), "run-main", "chain")
    finally:
        registry.close()


def test_the_cli_exits_0_on_a_clean_ledger_and_1_naming_a_tampered_process(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    registry = open_registry(url)
    try:
        _ledger(registry)
    finally:
        registry.close()
    clean = run_cli("verify", url=url)
    assert clean.returncode == 0, clean.stderr
    assert "ok" in clean.stdout
    raw = Raw(url)
    try:
        raw.replace_in_state("b", 3, b'"exit_code":0', b'"exit_code":7')
    finally:
        raw.close()
    tampered = run_cli("verify", url=url)
    assert tampered.returncode == 1
    assert "process 'b'" in tampered.stdout
    assert "process 'a'" not in tampered.stdout
    assert "Traceback" not in tampered.stderr
    as_json = run_cli("verify", "--json", url=url)
    assert as_json.returncode == 1
    document = orjson.loads(as_json.stdout)
    assert document["ok"] is False
    assert document["failed"] == ["b"]


def test_the_cli_refuses_a_missing_ledger_without_creating_it(tmp_path: Path) -> None:
    missing = tmp_path / "nothing.db"
    result = run_cli("verify", url=f"sqlite:///{missing}")
    assert result.returncode == 1
    assert str(missing) in result.stderr
    assert "Traceback" not in result.stderr
    assert not missing.exists()
