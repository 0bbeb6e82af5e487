"""For random histories, the incrementally maintained read models equal a from-scratch rebuild.

A ``RuleBasedStateMachine`` drives the registry with every kind of write — registrations,
lifecycle facts, producer events, terminals, leases, grants, transfers, session deletion,
pruning — including writes the registry refuses (which must leave no trace). ``check_rebuild``
(a rule, and again at teardown) snapshots what the read models answer (records with their
``change_seq``, grants, feed pages, tracking), rebuilds, and requires the same answers; a tiny
model of the grants is checked against both. The machine runs on each store.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    multiple,
    rule,
    run_state_machine_as_test,
)

from procledger import (
    Acquired,
    AlreadyTerminal,
    ExternalRef,
    LeaseOwner,
    NotFound,
    ProcessRegistry,
    ProcledgerError,
    SessionScope,
    WaitState,
    open_registry,
)
from procledger.testing import FakeClock

from ._support import KEY, registration, snapshot

PIDS = ["p0", "p1", "p2", "p3", "p4"]
SESSIONS = ["s0", "s1", "s2"]
OWNER = LeaseOwner(owner_id="prop", incarnation_id="1")
TERMINALS = [
    ("exited", "exited", 0),
    ("exited", "exited", 3),
    ("failed", "failed", None),
    ("interrupted", "interrupted", None),
    ("killed", "output_limit", None),
]

pids = st.sampled_from(PIDS)
sessions = st.sampled_from(SESSIONS)
OpenLedger = Callable[[FakeClock, ExitStack], ProcessRegistry]


class LedgerHistory(RuleBasedStateMachine):
    open_ledger: OpenLedger
    known = Bundle("known")

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.resources = ExitStack()
        self.registry = type(self).open_ledger(self.clock, self.resources)
        self.resources.callback(self.registry.close)
        self.grants: dict[str, set[str]] = {s: set() for s in SESSIONS}

    def attempt(self, action: Callable[[], Any]) -> bool:
        try:
            action()
        except ProcledgerError:
            return False
        return True

    # -- processes -----------------------------------------------------------------------------

    @initialize(target=known)
    def first_process(self) -> Any:
        self.registry.register(registration("p0"))
        return "p0"

    @rule(
        target=known, pid=pids, wake=st.none() | sessions, definition=st.none() | st.integers(0, 2)
    )
    def register(self, pid: str, wake: str | None, definition: int | None) -> Any:
        scope = None if wake is None else SessionScope(session_id=wake, agent_frame_id="f")
        registered = self.attempt(
            lambda: self.registry.register(
                registration(
                    pid,
                    wake=scope,
                    definition=None if definition is None else {"d": definition},
                )
            )
        )
        return pid if registered else multiple()

    @rule(pid=known, ms=st.integers(0, 5))
    def start(self, pid: str, ms: int) -> None:
        self.attempt(lambda: self.registry.record_started(pid, ms))

    @rule(pid=known)
    def background(self, pid: str) -> None:
        self.attempt(lambda: self.registry.record_backgrounded(pid, 1))

    @rule(pid=known, reason=st.sampled_from(["interrupted", "terminated", "killed"]))
    def request_stop(self, pid: str, reason: str) -> None:
        self.attempt(lambda: self.registry.request_stop(pid, reason))

    @rule(pid=known, key=st.sampled_from(["a", "b"]), payload=st.integers(0, 1))
    def append(self, pid: str, key: str, payload: int) -> None:
        self.attempt(
            lambda: self.registry.append_event(pid, "signal.ready", [payload], replay_key=key)
        )

    @rule(pid=known, name=st.sampled_from(["x", "y"]))
    def set_wait(self, pid: str, name: str) -> None:
        wait = WaitState(name=name, event_type="signal.ready", since_ms=self.clock.now_ms)
        self.attempt(lambda: self.registry.set_wait(pid, wait))

    @rule(pid=known)
    def clear_wait(self, pid: str) -> None:
        self.attempt(lambda: self.registry.clear_wait(pid))

    @rule(pid=known, ref=st.sampled_from(["1", "2"]))
    def external_ref(self, pid: str, ref: str) -> None:
        self.attempt(lambda: self.registry.set_external_ref(pid, ExternalRef(backend="b", id=ref)))

    @rule(pid=known)
    def first_started(self, pid: str) -> None:
        self.attempt(lambda: self.registry.record_first_started(pid, OWNER, self.clock.now_ms))

    @rule(pid=known)
    def request_abandon(self, pid: str) -> None:
        self.attempt(lambda: self.registry.request_abandon(pid, "prop"))

    @rule(pid=known, terminal=st.sampled_from(TERMINALS))
    def complete(self, pid: str, terminal: tuple[str, str, int | None]) -> None:
        state, reason, code = terminal
        self.attempt(
            lambda: self.registry.record_completed(
                pid, state, reason, exit_code=code, authority=KEY
            )
        )

    @rule(pid=known)
    def abandon(self, pid: str) -> None:
        self.attempt(lambda: self.registry.record_abandoned(pid, "owner_dead", authority=KEY))

    @rule(pid=known)
    def lease_churn(self, pid: str) -> None:
        try:
            claimed = self.registry.claim_lease(pid, OWNER, 1_000)
        except (NotFound, AlreadyTerminal):  # pruned, or ended: no lease on a terminal
            return
        if isinstance(claimed, Acquired):
            renewed = self.registry.renew_lease(claimed.lease, 2_000)
            self.registry.release_lease(renewed)

    @rule(ms=st.integers(1, 50))
    def tick(self, ms: int) -> None:
        self.clock.advance(ms)

    # -- sessions --------------------------------------------------------------------------------

    @rule(session=sessions, pid=known)
    def grant(self, session: str, pid: str) -> None:
        if self.attempt(lambda: self.registry.grant_handle(session, pid)):
            self.grants[session].add(pid)

    @rule(session=sessions, pid=known)
    def revoke(self, session: str, pid: str) -> None:
        if self.attempt(lambda: self.registry.revoke_handle(session, pid)):
            self.grants[session].discard(pid)

    @rule(source=sessions, destination=sessions, moved=st.lists(known, max_size=3))
    def transfer(self, source: str, destination: str, moved: list[str]) -> None:
        chosen = sorted(moved)
        if self.attempt(lambda: self.registry.transfer_handles(source, destination, chosen)):
            self.grants[source] -= set(chosen)
            self.grants[destination] |= set(chosen)

    @rule(session=sessions)
    def delete_session(self, session: str) -> None:
        report = self.registry.delete_session(session)
        assert report.revoked_handle_count == len(self.grants[session])
        self.grants[session] = set()

    @rule(
        back=st.integers(0, 60),
        status=st.sampled_from([None, "completed", "failed", "any"]),
        watermark=st.booleans(),
    )
    def prune(self, back: int, status: str | None, watermark: bool) -> None:
        up_to = self.registry.changes_since(0, 1_000_000)[1] if watermark else None
        selection = None if status is None else {"status": status}
        report = self.registry.prune_terminal(self.clock.now_ms - back, selection, up_to=up_to)
        for pid in report.processes:
            for held in self.grants.values():
                held.discard(pid)

    # -- the property ------------------------------------------------------------------------------

    @rule()
    def check_rebuild(self) -> None:
        live = snapshot(self.registry)
        modelled = sorted((s, p) for s, held in self.grants.items() for p in held)
        assert sorted((s, p) for s, p, _ in live["grants"]) == modelled
        self.registry.rebuild()
        assert snapshot(self.registry) == live

    def teardown(self) -> None:
        try:
            self.check_rebuild()
        finally:
            self.resources.close()


def _memory(clock: FakeClock, _: ExitStack) -> ProcessRegistry:
    return open_registry("memory://", clock=clock)


def _sqlite(clock: FakeClock, resources: ExitStack) -> ProcessRegistry:
    folder = Path(tempfile.mkdtemp(prefix="procledger-prop-"))
    resources.callback(shutil.rmtree, folder, ignore_errors=True)
    return open_registry(f"sqlite:///{folder / 'ledger.db'}", clock=clock)


def _machine(open_ledger: OpenLedger) -> type[LedgerHistory]:
    return type("History", (LedgerHistory,), {"open_ledger": staticmethod(open_ledger)})


def test_rebuild_equals_live_models_on_memory() -> None:
    run_state_machine_as_test(
        _machine(_memory), settings=settings(max_examples=60, stateful_step_count=40)
    )


@pytest.mark.slow
def test_rebuild_equals_live_models_on_sqlite() -> None:
    run_state_machine_as_test(
        _machine(_sqlite), settings=settings(max_examples=20, stateful_step_count=40)
    )


@pytest.mark.slow
@pytest.mark.postgres
def test_rebuild_equals_live_models_on_postgres(
    postgres_schemas: Callable[[], AbstractContextManager[str]],
) -> None:
    def open_postgres(clock: FakeClock, resources: ExitStack) -> ProcessRegistry:
        url = resources.enter_context(postgres_schemas())
        return open_registry(url, clock=clock)

    run_state_machine_as_test(
        _machine(open_postgres), settings=settings(max_examples=12, stateful_step_count=40)
    )
