"""The local durable outbox (``adapters/outbox.py``) and its delivery
(``application/outbox.deliver_outbox``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from procledger import LeaseOwner, open_registry
from procledger.adapters import state_dir
from procledger.adapters.outbox import Outbox, OutboxEntry, default_outbox
from procledger.application.outbox import deliver_outbox, store_key, this_host_id
from procledger.domain.registration import (
    Originator,
    ProcessInput,
    ProcessRegistration,
    env_ref_for,
)
from procledger.domain.vocabulary import ProcessState, RecoveryDisposition
from procledger.supervisor.decide import event_ids


def _entry(store: str, process_id: str = "p1", **fields: object) -> OutboxEntry:
    base: dict[str, object] = {
        "store": store,
        "host_id": this_host_id() or "",
        "process_id": process_id,
        "registration_hash": "sha256:x",
        "event_id": "00000000-0000-5000-8000-000000000000",
        "state": "exited",
        "reason": "exited",
        "owner": LeaseOwner.local_process("o").model_dump(mode="json"),
        "written_at_ms": 1,
        "exit_code": 7,
    }
    return OutboxEntry(**{**base, **fields})  # type: ignore[arg-type]


def test_the_state_directory_follows_xdg_and_is_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert state_dir.state_dir() == tmp_path / "xdg" / "procledger"
    outbox = default_outbox()
    assert outbox.directory == tmp_path / "xdg" / "procledger" / "outbox"
    for folder in (outbox.directory, outbox.directory.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    monkeypatch.setenv("XDG_STATE_HOME", "relative/ignored")  # the XDG rule: absolute only
    assert state_dir.state_dir() == Path.home() / ".local" / "state" / "procledger"


def test_an_entry_is_written_whole_privately_and_removed(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox")
    entry = _entry("sqlite:/a.db")
    path = outbox.put(entry)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(outbox.directory) == [path.name]  # no temporary file left behind
    assert outbox.entries() == [entry]
    assert outbox.entries("sqlite:/other.db") == []
    outbox.put(_entry("sqlite:/a.db", exit_code=3))  # a retried put replaces its own entry
    assert [e.exit_code for e in outbox.entries()] == [3]
    outbox.remove(entry)
    outbox.remove(entry)  # missing is fine
    assert outbox.entries() == []


def test_every_field_survives_the_file(tmp_path: Path) -> None:
    """What a delivery reads back is what the Supervisor put, nested values and all."""
    outbox = Outbox(tmp_path / "outbox")
    entry = _entry(
        "sqlite:/a.db",
        state="signaled",
        reason="signaled",
        exit_code=None,
        diagnostic="killed by signal 9 — out of memory?",
        signal=9,
        survivors=[4242, 4243],
        output={"stdout": {"bytes": 12, "segments": [[0, 12]]}, "stderr": None},
        tails={"stdout": "last line\n", "stderr": ""},
    )
    outbox.put(entry)
    assert outbox.entries() == [entry]


def test_a_damaged_entry_is_skipped_and_kept(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox")
    good = _entry("s", "good")
    outbox.put(good)
    damaged = outbox.directory / "0000damaged.json"
    damaged.write_bytes(b"{not json")
    assert outbox.entries() == [good]
    assert damaged.exists()  # it may be the only copy of an outcome


def _running_process(url: str, process_id: str, owner: LeaseOwner) -> tuple[str, str]:
    """A process started by ``owner`` whose lease is held; its (registration hash, completed id)."""
    registry = open_registry(url)
    try:
        registration = ProcessRegistration(
            id=process_id,
            input=ProcessInput.command(["true"], "/"),
            disposition=RecoveryDisposition.owner_bound,
            originator=Originator.host(),
            env_ref=env_ref_for({}),
        )
        record = registry.register(registration)
        registry.claim_lease(process_id, owner, 60_000)
        registry.record_first_started(process_id, owner, registry.now_ms())
        registry.record_started(process_id, registry.now_ms())
        return record.registration_hash, event_ids(process_id, record.registration_hash).completed
    finally:
        registry.close()


def test_delivery_waits_for_a_live_holder_and_is_idempotent(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    live = LeaseOwner.local_process("live-supervisor")  # this very process: alive
    reg_hash, completed = _running_process(url, "job", live)
    registry = open_registry(url)
    try:
        key = store_key(registry.location)
        assert key is not None
        outbox = Outbox(tmp_path / "outbox")
        entry = _entry(
            key,
            "job",
            registration_hash=reg_hash,
            event_id=completed,
            owner=live.model_dump(mode="json"),
        )
        outbox.put(entry)
        assert deliver_outbox(registry, outbox) == []  # its holder lives: it delivers itself
        assert outbox.entries() == [entry]
        lease = registry.get_lease("job")
        assert lease is not None
        registry.release_lease(lease)  # the holder gave up (as after its lease lapsed)
        (written,) = deliver_outbox(registry, outbox)
        assert (written.state, written.exit_code) == (ProcessState.exited, 7)
        assert outbox.entries() == []
        outbox.put(entry)  # delivered again (a stale copy): nothing new is appended
        assert deliver_outbox(registry, outbox) == []
        assert outbox.entries() == []
        assert [e.kind for e in registry.events("job")].count("completed") == 1
        assert registry.get_lease("job") is None
    finally:
        registry.close()


def test_entries_of_another_host_or_store_are_left_alone(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    owner = LeaseOwner.local_process("gone")
    reg_hash, _completed = _running_process(url, "job", owner)
    registry = open_registry(url)
    try:
        key = store_key(registry.location)
        assert key is not None
        outbox = Outbox(tmp_path / "outbox")
        elsewhere = _entry(key, "job", host_id="another-host:1", registration_hash=reg_hash)
        outbox.put(elsewhere)
        outbox.put(_entry("sqlite:/another.db", "job"))
        assert deliver_outbox(registry, outbox) == []
        assert len(outbox.entries()) == 2
        assert registry.get("job").state is ProcessState.running
    finally:
        registry.close()


def test_an_in_memory_store_has_no_outbox() -> None:
    registry = open_registry("memory://")
    try:
        assert store_key(registry.location) is None
    finally:
        registry.close()


def test_each_store_has_its_own_outbox_key(tmp_path: Path) -> None:
    """An entry is delivered only to the ledger it belongs to: two PostgreSQL databases, or a
    PostgreSQL database and a SQLite file, never share a key."""
    from procledger.adapters.sql.location import parse_store_url, store_key

    keys = {
        store_key(parse_store_url(url))
        for url in (
            "postgresql://u:p@db1:5432/ledger",
            "postgresql://u:p@db2:5432/ledger",
            "postgresql://u:p@db1:5432/ledger?schema=other",
            f"sqlite:///{tmp_path}/a.db",
        )
    }
    assert len(keys) == 4
    assert store_key(parse_store_url("memory://")) is None
    same = {
        store_key(parse_store_url(url))
        for url in ("postgresql://u:p@db1:5432/ledger", "postgresql://v:q@db1/ledger?retry_s=5")
    }
    assert len(same) == 1  # who connects, and how patiently, is not which ledger
