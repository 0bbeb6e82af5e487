"""The registry reads a recovery worker walks by (docs/design.md §3.6): ``non_terminal_ids``,
``held_leases`` and ``record_and_lease`` answer with records and leases, on every store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from procledger import (
    Acquired,
    Lease,
    LeaseOwner,
    ProcessRecord,
    ProcessRegistry,
    ProcessState,
    TerminalReason,
    open_registry,
)
from procledger.testing import FakeClock

from ._support import opaque_owner, register

TTL = 3_000


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def registry(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ProcessRegistry]:
    if request.param == "memory":
        url = "memory://"
    elif request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/reads.db"
    else:
        url = str(request.getfixturevalue("postgres_schema_url"))
    opened = open_registry(url, clock=FakeClock())
    try:
        yield opened
    finally:
        opened.close()


def claim(registry: ProcessRegistry, process_id: str, owner: LeaseOwner) -> Lease:
    outcome = registry.claim_lease(process_id, owner, TTL)
    assert isinstance(outcome, Acquired), outcome
    return outcome.lease


def finish(registry: ProcessRegistry, process_id: str) -> None:
    lease = claim(registry, process_id, opaque_owner("finisher"))
    registry.record_started(process_id, registry.now_ms())
    registry.record_completed(
        process_id, ProcessState.exited, TerminalReason.exited, exit_code=0, lease=lease
    )


def test_non_terminal_ids_in_code_point_order(registry: ProcessRegistry) -> None:
    for process_id in ("b", "B", "a", "done"):
        register(registry, process_id, "rerunnable")
    finish(registry, "done")
    assert registry.non_terminal_ids() == ["B", "a", "b"]


def test_held_leases_are_the_live_ones_on_going_processes(registry: ProcessRegistry) -> None:
    for process_id in ("held", "released", "done", "free"):
        register(registry, process_id, "rerunnable")
    held = claim(registry, "held", opaque_owner("holder"))
    registry.release_lease(claim(registry, "released", opaque_owner("gone")))
    finish(registry, "done")
    assert registry.held_leases(registry.now_ms()) == [held]
    assert registry.held_leases(held.expires_at_ms) == []  # expired by then


def looked(registry: ProcessRegistry, process_id: str) -> tuple[ProcessRecord, Lease | None]:
    found = registry.record_and_lease(process_id)
    assert found is not None
    return found


def test_record_and_lease_is_the_record_with_its_stored_lease(registry: ProcessRegistry) -> None:
    register(registry, "p", "rerunnable")
    record, stored = looked(registry, "p")
    assert record.id == "p"
    assert stored is None  # never claimed
    lease = claim(registry, "p", opaque_owner("holder"))
    assert looked(registry, "p")[1] == lease == registry.get_lease("p")
    registry.release_lease(lease)
    assert looked(registry, "p")[1] is None


def test_record_and_lease_of_an_ended_or_unknown_process(registry: ProcessRegistry) -> None:
    register(registry, "p", "rerunnable")
    finish(registry, "p")
    record, stored = looked(registry, "p")
    assert record.state is ProcessState.exited
    assert stored is None
    assert registry.record_and_lease("nobody") is None
