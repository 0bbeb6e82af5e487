"""Writes made together (``register_claimed_all``, ``write_all``): one transaction for a
burst, and each write's outcome exactly what it would have been alone -- a write that fails
fails alone, on SQLite and PostgreSQL (docs/design.md §7.3)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _shared import command_registration, write_transactions
from procledger import (
    InvalidTransition,
    LeaseLost,
    LeaseOwner,
    ProcessRegistry,
    RegistrationConflict,
    StoreUnavailable,
    open_registry,
)

OWNER = LeaseOwner.local_process("supervisor")
OTHER = LeaseOwner.local_process("other")
TTL = 30_000


def test_new_processes_are_registered_and_claimed_in_one_write(registry: ProcessRegistry) -> None:
    begun = write_transactions(registry)
    registrations = [command_registration(f"job-{i}") for i in range(5)]
    results = registry.register_claimed_all(registrations, OWNER, TTL)
    assert begun.count(True) == 1
    for index, result in enumerate(results):
        assert not isinstance(result, Exception)
        record, lease = result
        assert record.id == f"job-{index}"
        assert lease is not None
        assert registry.get_lease(record.id) == lease
        assert [e.kind for e in registry.events(record.id)] == ["registered", "first_started"]
    assert registry.verify().ok


def test_a_known_or_conflicting_id_gets_its_own_answer_and_the_rest_are_claimed(
    registry: ProcessRegistry,
) -> None:
    registry.register(command_registration("known"))
    registry.register(command_registration("taken", ("false",)))
    ids = ["new-1", "known", "taken", "new-2"]
    results = registry.register_claimed_all([command_registration(i) for i in ids], OWNER, TTL)
    assert isinstance(results[2], RegistrationConflict)
    known = results[1]
    assert not isinstance(known, Exception)
    assert known[1] is None  # as ``register_claimed`` answers a known id: nothing written
    assert [e.kind for e in registry.events("known")] == ["registered"]
    for result in (results[0], results[3]):
        assert not isinstance(result, Exception)
        assert result[1] is not None
    assert registry.verify().ok


def claimed(registry: ProcessRegistry, *ids: str) -> dict[str, object]:
    leases = {}
    for result in registry.register_claimed_all([command_registration(i) for i in ids], OWNER, TTL):
        assert not isinstance(result, Exception)
        leases[result[0].id] = result[1]
    return leases


def test_running_facts_are_written_together_and_a_refused_one_alone(
    registry: ProcessRegistry,
) -> None:
    leases = claimed(registry, "a", "b", "c")
    lease_c = leases["c"]
    registry.record_completed("c", "failed", "failed", lease=lease_c)  # type: ignore[arg-type]
    begun = write_transactions(registry)
    now = registry.now_ms()
    results = registry.write_all(
        [
            registry.running_write("a", now, background=True),
            registry.running_write("b", now),
            registry.running_write("c", now),
        ]
    )
    assert isinstance(results[2], InvalidTransition)
    assert [getattr(r, "state", None) for r in results[:2]] == ["running", "running"]
    assert registry.get("a").backgrounded
    assert not registry.get("b").backgrounded
    # the batch was tried once, rolled back, then each written alone
    assert begun.count(True) >= 2
    assert registry.get("c").state == "failed"
    assert registry.verify().ok


def test_terminals_with_leases_release_them_and_a_lost_lease_writes_nothing(
    registry: ProcessRegistry,
) -> None:
    leases = claimed(registry, "a", "b", "c")
    now = registry.now_ms()
    registry.write_all([registry.running_write(i, now) for i in "abc"])
    registry.release_lease(leases["b"])  # type: ignore[arg-type]
    registry.claim_lease("b", OTHER, TTL)
    begun = write_transactions(registry)
    results = registry.write_all(
        [
            registry.completed_write(i, "exited", "exited", exit_code=0, lease=leases[i])  # type: ignore[arg-type]
            for i in "abc"
        ]
    )
    assert isinstance(results[1], LeaseLost)
    assert [getattr(results[i], "state", None) for i in (0, 2)] == ["exited", "exited"]
    assert registry.get("b").state == "running"
    assert [registry.get_lease(i) for i in "ac"] == [None, None]
    assert begun.count(True) >= 2
    assert registry.verify().ok


def test_writes_of_one_process_twice_are_made_one_after_the_other(
    registry: ProcessRegistry,
) -> None:
    """A batch is of distinct processes: the same process twice is written as alone, in order."""
    leases = claimed(registry, "a")
    now = registry.now_ms()
    ended = registry.completed_write("a", "failed", "failed", lease=leases["a"])  # type: ignore[arg-type]
    results = registry.write_all([ended, registry.running_write("a", now)])
    assert getattr(results[0], "state", None) == "failed"
    assert isinstance(results[1], InvalidTransition)


FACTS = st.sampled_from(["started", "backgrounded", "exited", "exited_stale", "none"])


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["new", "running", "ended"]), FACTS), min_size=1, max_size=6)
)
def test_a_batch_ends_as_the_same_writes_one_by_one(plan: list[tuple[str, str]]) -> None:
    """The property behind batching: for any mix of processes (new, running, ended) and of
    writes to them (some refused), ``write_all`` leaves the same records and gives the same
    answers as the writes made one by one."""
    outcomes = []
    for batched in (True, False):
        registry = open_registry("memory://")
        try:
            outcomes.append(_run_plan(registry, plan, batched))
        finally:
            registry.close()
    assert outcomes[0] == outcomes[1]


def _run_plan(
    registry: ProcessRegistry, plan: list[tuple[str, str]], batched: bool
) -> tuple[list[object], list[tuple[str, str, object]]]:
    ids = [f"p{i}" for i in range(len(plan))]
    leases = claimed(registry, *ids)
    now = registry.now_ms()
    for pid, (setup, _) in zip(ids, plan, strict=True):
        if setup in ("running", "ended"):
            registry.record_started(pid, now)
        if setup == "ended":
            registry.record_completed(pid, "exited", "exited", exit_code=1, lease=leases[pid])  # type: ignore[arg-type]
    writes = []
    for pid, (_, fact) in zip(ids, plan, strict=True):
        if fact in ("started", "backgrounded"):
            writes.append(registry.running_write(pid, now, background=fact == "backgrounded"))
        elif fact != "none":
            lease = leases[pid]
            if fact == "exited_stale":
                lease = lease.model_copy(update={"fencing_token": lease.fencing_token + 1})  # type: ignore[attr-defined]
            writes.append(
                registry.completed_write(pid, "exited", "exited", exit_code=0, lease=lease)  # type: ignore[arg-type]
            )
    if batched:
        answers = registry.write_all(writes)
    else:
        answers = [registry.write_all([write])[0] for write in writes]
    summary = [type(a).__name__ if isinstance(a, Exception) else a.state for a in answers]  # type: ignore[union-attr]
    records = [(r.id, r.state, r.exit_code) for r in (registry.get(i) for i in ids)]
    return summary, records


def test_an_outage_fails_each_write_of_a_batch_once_not_one_wait_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While the store is unavailable a batch gets that error for each of its writes at once:
    made again one by one, each would ride through the store's retry window in turn."""
    registry = open_registry("memory://")
    try:
        leases = claimed(registry, "a", "b", "c")
        tried = []

        def unavailable(*args: object, **kwargs: object) -> list[int]:
            tried.append(args)
            raise StoreUnavailable("store 'memory://': the server went away")

        monkeypatch.setattr(registry._ledger, "append", unavailable)
        now = registry.now_ms()
        answers = registry.write_all([registry.running_write(i, now) for i in leases])
        assert len(tried) == 1
        assert [type(a) for a in answers] == [StoreUnavailable] * 3
        assert len({id(a) for a in answers}) == 3  # each caller raises its own
        registered = registry.register_claimed_all(
            [command_registration("d"), command_registration("e")], OWNER, TTL
        )
        assert len(tried) == 2
        assert [type(r) for r in registered] == [StoreUnavailable] * 2
        monkeypatch.undo()
        assert [registry.get(i).state for i in leases] == ["starting"] * 3
    finally:
        registry.close()
