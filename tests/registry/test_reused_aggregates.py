"""A registry reuses the aggregate its last write left, but never decides on a stale one.

Two registries on one ledger stand in for two processes: whatever one appends, prunes or
re-registers, the other's next write must decide on the log as it now stands.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from procledger import (
    AuthorityRejected,
    CompletionAuthority,
    ProcessInput,
    ProcessRegistry,
    ProcessState,
    StoreError,
    open_registry,
)
from procledger.domain.process import process_uuid
from procledger.domain.rendering import render_record
from procledger.testing import FakeClock

from .conformance import registration

AUTHORITY = CompletionAuthority.workflow_key("wf")


@pytest.fixture
def pair(shared_url: str) -> Iterator[tuple[ProcessRegistry, ProcessRegistry]]:
    clock = FakeClock()
    first = open_registry(shared_url, clock=clock)
    second = open_registry(shared_url, clock=clock)
    try:
        yield first, second
    finally:
        first.close()
        second.close()


def kinds(registry: ProcessRegistry, process_id: str) -> list[str]:
    return [event.kind for event in registry.events(process_id)]


def test_a_write_decides_on_what_another_registry_appended(
    pair: tuple[ProcessRegistry, ProcessRegistry],
) -> None:
    first, second = pair
    first.register(registration("p"))
    first.record_started("p", 1)
    second.request_stop("p", "killed")
    completed = first.record_completed("p", "killed", "killed", authority=AUTHORITY)
    assert completed.stop_requested == ["killed"]
    assert kinds(second, "p") == ["registered", "started", "stop_requested", "completed"]
    assert [event.sequence for event in second.events("p")] == [1, 2, 3, 4]
    assert render_record(first._ledger.load_process("p"), completed.change_seq) == completed


def test_a_process_pruned_and_registered_again_elsewhere_is_replayed_afresh(
    pair: tuple[ProcessRegistry, ProcessRegistry],
) -> None:
    first, second = pair
    first.register(registration("p"))
    first.record_started("p", 1)
    first.record_completed("p", "exited", "exited", exit_code=0, authority=AUTHORITY)
    assert second.prune_terminal(cutoff_ms=10**15).processes == ["p"]
    again = registration("p", input=ProcessInput.command(["/bin/true"]))
    second.register(again)
    started = first.record_started("p", 2)
    assert started.input == again.input
    assert started.state is ProcessState.running
    assert kinds(second, "p") == ["registered", "started"]


def test_a_write_notices_an_event_damaged_behind_its_back(
    pair: tuple[ProcessRegistry, ProcessRegistry],
) -> None:
    first, _ = pair
    first.register(registration("p"))
    first.record_started("p", 1)
    store = first._store
    key: Any = process_uuid("p")
    with store.write() as tx:
        tx.execute(
            f"UPDATE {store.events_table} SET state=? "
            "WHERE originator_id=? AND originator_version=1",
            (b"\x00garbage{", store.dialect.originator_key(key)),
        )
    with pytest.raises(StoreError, match="'p'"):
        first.request_stop("p", "killed")


def test_a_decision_refused_half_way_leaves_nothing_behind(
    pair: tuple[ProcessRegistry, ProcessRegistry],
) -> None:
    first, _ = pair
    first.register(registration("p"))
    first.record_started("p", 1)
    # The aggregate decides the completion first; only then is the missing authority refused.
    with pytest.raises(AuthorityRejected):
        first.record_completed("p", "exited", "exited", exit_code=0)
    stopped = first.request_stop("p", "terminated")
    assert stopped.state is ProcessState.running
    completed = first.record_completed("p", "terminated", "terminated", authority=AUTHORITY)
    assert kinds(first, "p") == ["registered", "started", "stop_requested", "completed"]
    assert render_record(first._ledger.load_process("p"), completed.change_seq) == completed
