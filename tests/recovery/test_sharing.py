"""Recovery workers share work (docs/design.md §3.6): each takes the next process whose lease is
free, passing over what another worker is taking (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, the
writer lock on SQLite) or holds, so no process is visited by two workers."""

from __future__ import annotations

import threading

from procledger import (
    Lease,
    LeaseOwner,
    LeaseTimings,
    ProcessRecord,
    ProcessRegistry,
    open_registry,
)
from procledger.adapters.sql import lease_rows
from procledger.recovery import RecoveryWorker, RunResult, SweepReport

from ._support import opaque_owner, register

TIMINGS = LeaseTimings(ttl_ms=30_000, renew_ms=10_000)
WAIT_S = 30.0


def test_the_search_for_free_work_passes_over_rows_another_transaction_is_taking(
    registry: ProcessRegistry,
) -> None:
    """PostgreSQL: a second search, while the first still holds ``a``, gets ``b`` at once.
    SQLite: the second search cannot begin until the first ends (its writer lock), and then
    ``a`` is held, so it gets ``b`` too."""
    for process_id in ("a", "b"):
        register(registry, process_id, "rerunnable")
    store, now = registry._store, registry.now_ms()
    found: list[str] = []
    second = threading.Thread(
        target=lambda: found.append(
            registry.claim_next_free("", opaque_owner("second"), 30_000, lambda *_: True).process_id  # type: ignore[union-attr]
        )
    )
    with store.write() as tx:
        first = lease_rows.next_free(tx, "", now)
        assert first["process_id"] == "a"
        lease_rows.ensure_locked(tx, "a")
        lease_rows.take(
            tx,
            "a",
            owner_json=opaque_owner("first").model_dump_json(),
            lease_token="first",
            fencing_token=1,
            claimed_at_ms=now,
            expires_at_ms=now + 30_000,
        )
        second.start()
        if store.dialect.name == "postgresql":
            second.join(WAIT_S)
            assert found == ["b"]  # not blocked by the row this transaction holds
    second.join(WAIT_S)
    assert found == ["b"]
    assert registry.get_lease("a").owner.owner_id == "first"  # type: ignore[union-attr]
    assert registry.get_lease("b").owner.owner_id == "second"  # type: ignore[union-attr]


def test_postgres_searches_lock_with_skip_locked(registry: ProcessRegistry) -> None:
    """The statement itself, on each store: PostgreSQL passes over locked rows; SQLite's search
    runs inside a write transaction, which already excludes every other writer."""
    suffix = registry._store.dialect.skip_locked("r")
    if registry._store.dialect.name == "postgresql":
        assert suffix == " FOR UPDATE OF r SKIP LOCKED"
    else:
        assert suffix == ""


def test_a_claim_that_wins_between_the_search_and_the_take_is_respected(
    registry: ProcessRegistry,
) -> None:
    """Found free, then claimed by a supervisor before this search takes it: not taken."""
    register(registry, "job", "rerunnable")
    rival = opaque_owner("rival")

    def rival_claims_first(record: ProcessRecord, lapsed: Lease | None) -> bool:
        if registry._store.dialect.name == "postgresql":  # SQLite: one writer, no such window
            claimer = threading.Thread(target=registry.claim_lease, args=("job", rival, 30_000))
            claimer.start()
            claimer.join(WAIT_S)
        return True

    found = registry.claim_next_free("", opaque_owner("w"), 30_000, rival_claims_first)
    assert found is not None
    if registry._store.dialect.name == "postgresql":
        assert found.acquired is None
        assert registry.get_lease("job").owner == rival  # type: ignore[union-attr]
    else:
        assert found.acquired is not None


class Gate:
    """A runner that holds every run until released, recording which worker ran what."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ran: list[str] = []

    def __call__(self, record: ProcessRecord, lease: Lease, cancel: threading.Event) -> RunResult:
        with self.lock:
            self.ran.append(record.id)
        return RunResult()


def test_workers_sweeping_at_once_never_visit_the_same_process(
    registry: ProcessRegistry, shared_url: str
) -> None:
    count, workers = 60, 4
    for index in range(count):
        register(registry, f"job-{index:03}", "rerunnable")
    gate = Gate()
    reports: list[SweepReport] = []
    opened = [open_registry(shared_url) for _ in range(workers)]
    try:
        sweepers = [
            RecoveryWorker(each, LeaseOwner.local_process(f"w{n}"), gate, timings=TIMINGS)
            for n, each in enumerate(opened)
        ]
        threads = [
            threading.Thread(target=lambda w=worker: reports.append(w.sweep()))
            for worker in sweepers
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads)
    finally:
        for each in opened:
            each.close()
    visited = [pid for report in reports for group in report.model_dump().values() for pid in group]
    assert sorted(visited) == sorted(gate.ran) == [f"job-{index:03}" for index in range(count)]
    assert all(report.skipped == [] for report in reports)  # nobody visited held work
