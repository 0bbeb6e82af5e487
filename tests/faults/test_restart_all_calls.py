"""Every kind of call rides through a PostgreSQL restart (issue 13, docs/design.md §7.3).

``test_pg_restart`` drives appends only. Here four threads share one registry and keep making
the whole mix of calls a supervisor, a recovery worker and a notifier make — register, claim,
renew, get and release a lease, record a start, append a producer event, journal a completion
notification, store and load an environment, read a log and list the processes — while the
test cluster restarts with ``pg_ctl restart -m fast`` and ``-m immediate``. No call may fail
(each runs its transaction again within the store's retry window), every answer must agree
with what the thread wrote, and every acknowledged write must be in the ledger afterwards, read
through a registry opened after the restart.

The cluster is restarted only through ``_cluster.Cluster`` (which keeps the server's options
and port and waits until it accepts connections), and the fixture waits for the server again
before the schema is dropped, so no later test meets a server that is down.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import pytest

from _cluster import Cluster
from _shared import wait_until
from procledger import ProcessRegistry, open_registry
from procledger.domain.leases import Acquired, Lease, LeaseOwner
from procledger.domain.notification import ProcessCompletionNotification
from registry.conformance import registration

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

T = TypeVar("T")

CALLERS = 4
TTL_MS = 600_000  # no lease expires during the test: a lost lease is a lost write
CYCLES_EACH_SIDE = 3
"""Cycles every caller completes before the restart, and again after the server is back."""


@dataclass
class Acknowledged:
    """What the ledger acknowledged for one process, step by step."""

    started: bool = False
    replay_key: str | None = None
    lease: Lease | None = None
    released: bool = False
    notification: ProcessCompletionNotification | None = None
    env: tuple[str, dict[str, str]] | None = None


@dataclass
class Caller:
    """One thread's cycles of calls: its acknowledged writes and its failures."""

    name: str
    owner: LeaseOwner
    session_id: uuid.UUID = field(default_factory=uuid.uuid4)
    loop_id: uuid.UUID = field(default_factory=uuid.uuid4)
    acknowledged: dict[str, Acknowledged] = field(default_factory=dict)
    cycles: int = 0
    calls: int = 0
    failures: list[BaseException] = field(default_factory=list)

    def run(self, registry: ProcessRegistry, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.cycle(registry, f"{self.name}-{self.cycles:05d}")
            except BaseException as error:  # recorded, asserted by the test
                self.failures.append(error)
                return
            self.cycles += 1

    def call(self, made: Callable[[], T]) -> T:
        self.calls += 1
        return made()

    def cycle(self, registry: ProcessRegistry, process_id: str) -> None:
        """One process through every call of the mix; each answer is checked at once."""
        acked = self.acknowledged[process_id] = Acknowledged()
        self.call(lambda: registry.register(registration(process_id)))
        self.lease_calls(registry, process_id, acked)
        event_id = str(uuid.uuid5(uuid.NAMESPACE_URL, process_id))
        self.call(lambda: registry.record_started(process_id, self.cycles, event_id=event_id))
        acked.started = True
        key = f"{process_id}/ready"
        self.call(lambda: registry.append_event(process_id, "signal.ready", {}, replay_key=key))
        acked.replay_key = key
        self.journal_calls(registry, process_id, acked)
        self.env_calls(registry, process_id, acked)
        logged = self.call(lambda: registry.events(process_id))
        assert key in [event.replay_key for event in logged], logged
        if self.cycles % 2:
            lease = acked.lease
            assert lease is not None
            self.call(lambda: registry.release_lease(lease))
            acked.released = True
            assert self.call(lambda: registry.get_lease(process_id)) is None
        if self.cycles % 3 == 0:
            listed = self.call(lambda: registry.list_processes({"status": "any"}))
            assert process_id in {record.id for record in listed}

    def lease_calls(self, registry: ProcessRegistry, process_id: str, acked: Acknowledged) -> None:
        claimed = self.call(lambda: registry.claim_lease(process_id, self.owner, TTL_MS))
        assert isinstance(claimed, Acquired), claimed
        acked.lease = claimed.lease
        renewed = self.call(lambda: registry.renew_lease(claimed.lease, TTL_MS))
        assert _same_lease(renewed, claimed.lease), (renewed, claimed.lease)
        acked.lease = renewed
        held = self.call(lambda: registry.get_lease(process_id))
        assert held is not None
        assert _same_lease(held, renewed), (held, renewed)

    def journal_calls(
        self, registry: ProcessRegistry, process_id: str, acked: Acknowledged
    ) -> None:
        note = ProcessCompletionNotification.model_validate(
            {
                "command_id": str(uuid.uuid5(uuid.NAMESPACE_OID, process_id)),
                "session_id": str(self.session_id),
                "loop_id": str(self.loop_id),
                "process_handle": "AAAAAAAAAAAAAAAAAAAAAA",
                "state": "exited",
                "reason": "exited",
            }
        )
        self.call(lambda: registry.journal_append(note))
        acked.notification = note
        assert self.call(lambda: registry.journal_get(note.command_id)) == note

    def env_calls(self, registry: ProcessRegistry, process_id: str, acked: Acknowledged) -> None:
        values = {"PROCESS": process_id}
        env_ref = self.call(lambda: registry.store_env(values))
        acked.env = (env_ref, values)
        assert self.call(lambda: registry.load_env(env_ref)) == values


def _same_lease(lease: Lease, other: Lease) -> bool:
    """The same grant (process, holder, tokens), whatever its expiry."""
    keys = ("process_id", "owner", "lease_token", "fencing_token", "claimed_at_ms")
    return all(getattr(lease, key) == getattr(other, key) for key in keys)


def lost_writes(registry: ProcessRegistry, callers: list[Caller]) -> list[tuple[str, str]]:
    """``(process id, what)`` for each acknowledged write the ledger does not hold."""
    lost: list[tuple[str, str]] = []
    records = {r.id: r for r in registry.list_processes({"status": "any"})}
    for caller in callers:
        for process_id, acked in caller.acknowledged.items():
            record = records.get(process_id)
            if record is None:
                lost.append((process_id, "registration"))
                continue
            if acked.started and record.state.value != "running":
                lost.append((process_id, f"start (state {record.state.value})"))
            keys = [event.replay_key for event in registry.events(process_id)]
            if acked.replay_key is not None and acked.replay_key not in keys:
                lost.append((process_id, "producer event"))
            lost += _lost_lease(registry, process_id, acked)
            note = acked.notification
            if note is not None and registry.journal_get(note.command_id) != note:
                lost.append((process_id, "journal entry"))
            if acked.env is not None and registry.load_env(acked.env[0]) != acked.env[1]:
                lost.append((process_id, "environment"))
    return lost


def _lost_lease(
    registry: ProcessRegistry, process_id: str, acked: Acknowledged
) -> list[tuple[str, str]]:
    held = registry.get_lease(process_id)
    if acked.released:
        return [] if held is None else [(process_id, "lease release")]
    if acked.lease is None:
        return []
    if held is None or not _same_lease(held, acked.lease):
        return [(process_id, f"lease (held {held})")]
    if held.expires_at_ms < acked.lease.expires_at_ms:
        return [(process_id, "lease renewal")]
    return []


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_restart_fails_no_call_of_any_kind_and_loses_no_write(
    mode: str, cluster: Cluster, restart_url: str
) -> None:
    registry = open_registry(restart_url)
    callers = [
        Caller(f"c{n}", LeaseOwner(owner_id=f"c{n}", incarnation_id="one")) for n in range(CALLERS)
    ]
    stop = threading.Event()
    threads = [threading.Thread(target=c.run, args=(registry, stop)) for c in callers]
    try:
        for thread in threads:
            thread.start()
        wait_until(
            lambda: all(c.cycles >= CYCLES_EACH_SIDE or c.failures for c in callers),
            60,
            "cycles before the restart",
        )
        before = [c.cycles for c in callers]
        cluster.restart(mode)
        wait_until(
            lambda: all(
                c.cycles >= b + CYCLES_EACH_SIDE or c.failures
                for c, b in zip(callers, before, strict=True)
            ),
            60,
            "cycles after the restart",
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
        registry.close()
    assert not any(thread.is_alive() for thread in threads)
    assert [repr(f) for c in callers for f in c.failures] == []
    assert sum(c.calls for c in callers) > CALLERS * 2 * CYCLES_EACH_SIDE * 10
    reopened = open_registry(restart_url)
    try:
        assert lost_writes(reopened, callers) == []
    finally:
        reopened.close()
