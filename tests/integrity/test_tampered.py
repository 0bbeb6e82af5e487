"""A process whose hash chain does not verify is reported damaged, not served (docs/design.md
§13.1, §13.5). Before, an exit code edited in a process's last stored event was flagged by
``verify`` but still served by ``events`` and copied into the read model by ``rebuild``, and a
write to a process whose last event was edited chained onto the edit and hid it.

The damage shows in the ``records`` table itself -- the row holds ``{"damaged": "<why>"}`` --
so a reader of that table with the standard library alone (``damage.read_record_row``) comes
to the same conclusion as the store.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from _shared import run_cli
from procledger import ProcessInput, ProcessRegistry, StoreCorrupt, open_registry
from procledger.adapters.sql.damage import DAMAGED, read_record_row
from registry.conformance import KEY, registration

from ._raw import Raw

EDITED = (b'"exit_code":0', b'"exit_code":7')


def _ledger(registry: ProcessRegistry) -> None:
    """Two finished processes and one running: ``c`` is the one tampered with."""
    for name in ("b", "c"):
        registry.register(registration(name, input=ProcessInput.command(["true"])))
        registry.record_started(name, 1)
        registry.record_completed(name, "exited", "exited", exit_code=0, authority=KEY)
    registry.register(registration("running"))
    registry.record_started("running", 1)


@pytest.fixture
def tampered(registry: ProcessRegistry, url: str) -> Iterator[tuple[ProcessRegistry, Raw]]:
    """The ledger, with ``c``'s exit code edited in its last stored event (v3)."""
    _ledger(registry)
    raw = Raw(url)
    raw.replace_in_state("c", 3, *EDITED)
    yield registry, raw
    raw.close()


def stored_records(raw: Raw) -> dict[str, object]:
    """The ``records`` table's ``record`` column, by process id, as a stdlib reader sees it."""
    rows = raw.run(f"SELECT process_id, record FROM {raw.table('records')}")
    return {str(process_id): record for process_id, record in rows}


def test_its_events_are_refused_before_any_rebuild(
    tampered: tuple[ProcessRegistry, Raw],
) -> None:
    registry, _ = tampered
    report = registry.verify()
    assert report.failed == ["c"]
    with pytest.raises(StoreCorrupt, match=r"'c'.*does not verify.*procledger verify") as caught:
        registry.events("c")
    assert caught.value.process_id == "c"
    with pytest.raises(StoreCorrupt, match="'c'"):
        registry.events("c", after=2)  # a later page is checked against the head too
    assert [e.kind for e in registry.events("b")][-1] == "completed"


def test_rebuild_marks_it_damaged_and_every_read_says_so(
    tampered: tuple[ProcessRegistry, Raw],
) -> None:
    registry, raw = tampered
    report = registry.rebuild()
    assert report.damaged == report.marked == ["c"]
    scan = registry.scan_processes({"status": "any"})
    assert [r.id for r in scan.records] == ["b", "running"]
    assert scan.damaged == ["c"]
    with pytest.raises(StoreCorrupt, match=r"'c'.*does not verify.*procledger verify") as caught:
        registry.get("c")
    assert caught.value.process_id == "c"
    with pytest.raises(StoreCorrupt, match="'c'"):
        registry.events("c")
    page = registry.scan_changes(0, 10)
    assert page.damaged == ["c"]
    # The edited exit code reached no row: the row holds the marker, and says why.
    rows = stored_records(raw)
    marker = orjson.loads(rows["c"])  # type: ignore[arg-type]
    assert list(marker) == [DAMAGED]
    assert "the last event v3 was changed" in marker[DAMAGED]
    assert b'"exit_code":7' not in str(rows["c"]).encode()


def test_a_stdlib_reader_of_the_records_table_comes_to_the_same_conclusion(
    tampered: tuple[ProcessRegistry, Raw],
) -> None:
    registry, raw = tampered
    registry.rebuild()
    damaged = {
        process_id
        for process_id, record in stored_records(raw).items()
        if read_record_row(process_id, record).damage is not None  # type: ignore[arg-type]
    }
    assert damaged == set(registry.scan_processes({"status": "any"}).damaged) == {"c"}
    document = read_record_row("b", stored_records(raw)["b"]).document  # type: ignore[arg-type]
    assert document is not None
    assert document == registry.get("b").model_dump(mode="json")


def test_verify_accepts_the_marked_row_and_a_restored_log_is_rebuilt(
    tampered: tuple[ProcessRegistry, Raw],
) -> None:
    registry, raw = tampered
    registry.rebuild()
    assert {(p.check, p.process_id) for p in registry.verify().problems} == {("chain", "c")}
    assert registry.rebuild().marked == ["c"]  # again: the same marker, written once
    raw.replace_in_state("c", 3, EDITED[1], EDITED[0])  # the edit undone
    report = registry.verify()
    assert [(p.check, p.process_id) for p in report.problems] == [("read_model", "c")]
    assert "marked damaged" in report.problems[0].detail
    assert registry.rebuild().damaged == []
    assert registry.get("c").exit_code == 0
    assert registry.verify().ok


def test_a_write_never_chains_onto_an_edited_event(registry: ProcessRegistry, url: str) -> None:
    """Chaining the next event to an edited last one would make the edit verify."""
    _ledger(registry)
    registry.request_stop("running", "terminated")  # a reused aggregate, then a fresh read
    raw = Raw(url)
    try:
        raw.replace_in_state("running", 3, b'"terminated"', b'"killed"')
        for write in (
            lambda: registry.request_stop("running", "interrupted"),
            lambda: registry.record_completed(
                "running", "exited", "exited", exit_code=0, authority=KEY
            ),
        ):
            with pytest.raises(StoreCorrupt, match=r"'running'.*does not verify"):
                write()
        count = raw.run(
            f"SELECT COUNT(*) FROM {raw.events} WHERE originator_id=?", (raw.key("running"),)
        )
        assert count == [(3,)]  # nothing appended
    finally:
        raw.close()
    assert registry.verify().failed == ["running"]  # still named: the edit was not hidden
    registry.register(registration("other"))
    assert registry.request_stop("other", "terminated").stop_requested == ["terminated"]


# -- the command line (SQLite) ----------------------------------------------------------------


@pytest.fixture
def tampered_file(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    registry = open_registry(url)
    try:
        _ledger(registry)
    finally:
        registry.close()
    raw = Raw(url)
    try:
        raw.replace_in_state("c", 3, *EDITED)
    finally:
        raw.close()
    return url


def test_the_cli_lists_it_among_the_damaged_and_show_refuses_it(tampered_file: str) -> None:
    url = tampered_file
    before = run_cli("show", "c", url=url)  # before any rebuild: its log is read, and refused
    assert before.returncode == 1
    assert before.stderr.count("\n") == 1, before.stderr
    assert "does not verify" in before.stderr
    assert "'c'" in before.stderr
    assert "procledger verify" in before.stderr
    rebuilt = run_cli("rebuild", url=url)
    assert rebuilt.returncode == 1
    assert "marked damaged" in rebuilt.stderr
    assert ": c;" in rebuilt.stderr
    listing = run_cli("ps", "--all", url=url)
    assert listing.returncode == 0, listing.stderr
    assert "damaged record(s) not listed: c" in listing.stderr
    assert "\nc\t" not in listing.stdout
    as_json = orjson.loads(run_cli("ps", "--all", "--json", url=url).stdout)
    assert as_json["damaged"] == ["c"]
    assert [r["id"] for r in as_json["records"]] == ["b", "running"]
    shown = run_cli("show", "c", url=url)
    assert shown.returncode == 1
    assert shown.stderr.count("\n") == 1, shown.stderr
    assert "does not verify" in shown.stderr
    assert "Traceback" not in shown.stderr
