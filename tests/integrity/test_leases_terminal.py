"""No lease on a terminal process (docs/design.md §3.5): a claim or reclaim on one is
``AlreadyTerminal``, decided inside the claim's transaction; and a terminal replayed with a
lease still held releases it in the replay's transaction. Before this, a claim on an ``exited``
process granted a new fence, and a replay with that lease left it live for good."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from procledger import Acquired, AlreadyTerminal, ProcessRegistry, open_registry
from procledger.testing import FakeClock
from registry.conformance import KEY, owner, registration


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def registry(
    request: pytest.FixtureRequest, clock: FakeClock, tmp_path: Path
) -> Iterator[ProcessRegistry]:
    """Every store kind, memory:// included: the rule is the registry's."""
    url = {
        "memory": lambda: "memory://",
        "sqlite": lambda: f"sqlite:///{tmp_path / 'ledger.db'}",
        "postgres": lambda: str(request.getfixturevalue("postgres_schema_url")),
    }[request.param]()
    opened = open_registry(url, clock=clock)
    try:
        yield opened
    finally:
        opened.close()


def _exited(registry: ProcessRegistry, process_id: str) -> None:
    registry.register(registration(process_id))
    registry.record_started(process_id, 1)
    registry.record_completed(process_id, "exited", "exited", exit_code=0, authority=KEY)


def test_claiming_a_terminal_process_is_already_terminal_and_leaves_no_lease(
    registry: ProcessRegistry,
) -> None:
    _exited(registry, "done")
    with pytest.raises(AlreadyTerminal, match="'done'") as caught:
        registry.claim_lease("done", owner(), 30_000)
    assert caught.value.process_id == "done"
    assert caught.value.from_state == "exited"
    assert registry.get_lease("done") is None


def test_reclaiming_a_terminal_process_is_already_terminal(registry: ProcessRegistry) -> None:
    registry.register(registration("p"))
    claimed = registry.claim_lease("p", owner("first"), 30_000)
    assert isinstance(claimed, Acquired)
    registry.record_completed("p", "failed", "failed", diagnostic="gone", lease=claimed.lease)
    with pytest.raises(AlreadyTerminal, match="'p'"):
        registry.reclaim_lease("p", owner("second"), claimed.lease, 30_000)
    assert registry.get_lease("p") is None


def test_a_replayed_terminal_with_a_lease_still_held_releases_it(
    registry: ProcessRegistry,
) -> None:
    # A worker holds the lease while the work is recorded ended by an authority; the worker's
    # own (identical) terminal then arrives as a replay: nothing is appended, and the lease
    # must not stay live on the ended process.
    registry.register(registration("p"))
    registry.record_started("p", 1)
    claimed = registry.claim_lease("p", owner(), 60_000)
    assert isinstance(claimed, Acquired)
    first = registry.record_completed(
        "p", "exited", "exited", exit_code=3, event_id="e-1", authority=KEY
    )
    assert registry.get_lease("p") == claimed.lease  # still live: nobody released it yet
    again = registry.record_completed(
        "p", "exited", "exited", exit_code=3, event_id="e-1", lease=claimed.lease
    )
    assert again == first
    assert [event.sequence for event in registry.events("p")] == [1, 2, 3]
    assert registry.get_lease("p") is None


def test_a_replay_with_a_superseded_lease_releases_nothing_else(
    registry: ProcessRegistry, clock: FakeClock
) -> None:
    registry.register(registration("p"))
    registry.record_started("p", 1)
    first = registry.claim_lease("p", owner("a"), 1_000)
    assert isinstance(first, Acquired)
    clock.advance(2_000)  # the first lease lapses; another worker takes over
    second = registry.claim_lease("p", owner("b"), 60_000)
    assert isinstance(second, Acquired)
    registry.record_completed("p", "exited", "exited", exit_code=0, authority=KEY, event_id="x")
    registry.record_completed("p", "exited", "exited", exit_code=0, event_id="x", lease=first.lease)
    assert registry.get_lease("p") == second.lease  # a stale lease releases only itself
