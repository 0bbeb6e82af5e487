"""Starts and terminals made together (``Supervisor.start_all``, ``Settle.together``): their
writes share transactions, and each start or terminal ends exactly as it would alone -- a bad
argument, a missing program or a lost lease fails only its own (docs/design.md §6.2, §7.3)."""

from __future__ import annotations

import os
import select
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from _shared import Processes, command_registration, dead_owner, write_transactions
from procledger import (
    LeaseOwner,
    ProcessHandle,
    ProcessRegistry,
    SpawnError,
    SupervisorClosed,
)
from procledger.supervisor.decide import event_ids
from procledger.supervisor.execution import OwnedChild, StopPolicy
from procledger.supervisor.supervisor import Settle, Supervisor


def sleeper(pidfile: Path) -> list[str]:
    return ["sh", "-c", f'echo $$ > "{pidfile}.tmp" && mv "{pidfile}.tmp" "{pidfile}" && '
            "exec sleep 60"]  # fmt: skip


def test_each_start_of_a_burst_ends_as_it_would_alone(
    registry: ProcessRegistry, owner: LeaseOwner, procs: Processes
) -> None:
    pidfiles = [procs.pidfile(f"child-{i}") for i in range(3)]
    with Supervisor(registry, owner=owner, stop=StopPolicy(grace_s=5.0)) as supervisor:
        begun = write_transactions(registry)
        results = supervisor.start_all(
            [
                (sleeper(pidfiles[0]), {"capture": False}),
                ([], {}),  # no command word
                (sleeper(pidfiles[1]), {"background": True}),
                (["true"], {"colour": "blue"}),  # no such option
                (["/nonexistent/program"], {}),
                (sleeper(pidfiles[2]), {}),
            ]
        )
        writes = begun.count(True)
        assert isinstance(results[1], ValueError | TypeError)
        assert isinstance(results[3], TypeError)
        assert isinstance(results[4], SpawnError)
        handles = [results[i] for i in (0, 2, 5)]
        assert all(isinstance(h, ProcessHandle) for h in handles)
        # the four registrations in one write, the spawn failure's terminal, the three
        # children running in one more
        assert writes == 3
        for pidfile in pidfiles:
            procs.await_pid(pidfile)
        records = [registry.get(h.process_id) for h in handles]  # type: ignore[union-attr]
        assert [(r.state, r.backgrounded) for r in records] == [
            ("running", False),
            ("running", True),
            ("running", False),
        ]
        assert {r.state for r in registry.list_processes({"status": "any"})} == {
            "running",
            "failed",
        }
        assert len(registry.list_processes({"status": "any"})) == 4  # nothing for bad arguments
        for handle in handles:
            record = supervisor.stop(handle, "terminate", grace_s=5)  # type: ignore[arg-type]
            assert record.state == "terminated"
    assert registry.verify().ok


def test_a_closed_supervisor_starts_none(registry: ProcessRegistry, owner: LeaseOwner) -> None:
    supervisor = Supervisor(registry, owner=owner)
    supervisor.shutdown()
    with pytest.raises(SupervisorClosed):
        supervisor.start_all([(["true"], {}), (["true"], {})])
    assert registry.list_processes({"status": "any"}) == []


class Collected:
    """A ``watch`` that keeps each child and its settle, for the test to drive."""

    def __init__(self) -> None:
        self.children: list[tuple[OwnedChild, Settle]] = []

    def __call__(self, child: OwnedChild, settle: Settle) -> None:
        self.children.append((child, settle))


def run_to_exit(child: OwnedChild, within_s: float = 20.0) -> None:
    """Step ``child`` as an event loop would (``Watch``) until it has completed."""
    deadline = time.monotonic() + within_s
    while not child.advance():
        assert time.monotonic() < deadline, "the child did not end"
        watched = child.watched()
        readable = [fd for fd, write in watched if not write]
        writable = [fd for fd, write in watched if write]
        select.select(readable, writable, [], 0.5)


@pytest.fixture
def watched(
    registry: ProcessRegistry, owner: LeaseOwner
) -> Iterator[tuple[Supervisor, Collected, Callable[..., Any]]]:
    collected = Collected()
    supervisor = Supervisor(registry, owner=owner, watch=collected)

    def started(*argvs: list[str]) -> list[ProcessHandle]:
        results = supervisor.start_all([(argv, {}) for argv in argvs])
        assert all(isinstance(r, ProcessHandle) for r in results), results
        return results  # type: ignore[return-value]

    yield supervisor, collected, started
    supervisor.shutdown(grace_s=1.0)


def test_terminals_that_are_due_together_are_written_together(
    registry: ProcessRegistry, watched: tuple[Supervisor, Collected, Callable[..., Any]]
) -> None:
    supervisor, collected, started = watched
    handles = started(["sh", "-c", "exit 0"], ["sh", "-c", "exit 3"], ["sh", "-c", "kill -9 $$"])
    for child, _ in collected.children:
        run_to_exit(child)
    begun = write_transactions(registry)
    Settle.together([settle for _, settle in collected.children])
    assert begun.count(True) == 1
    records = [supervisor.wait(handle, timeout=5) for handle in handles]
    assert [(r.state, r.exit_code, r.signal) for r in records] == [
        ("exited", 0, None),
        ("exited", 3, None),
        ("signaled", None, 9),
    ]
    assert all(registry.get_lease(h.process_id) is None for h in handles)
    assert registry.verify().ok


def test_a_terminal_whose_lease_was_lost_is_left_to_its_new_holder_alone(
    registry: ProcessRegistry, watched: tuple[Supervisor, Collected, Callable[..., Any]]
) -> None:
    supervisor, collected, started = watched
    handles = started(["true"], ["true"], ["true"])
    for child, _ in collected.children:
        run_to_exit(child)
    taken = handles[1].process_id
    lease = registry.get_lease(taken)
    assert lease is not None
    registry.release_lease(lease)
    registry.claim_lease(taken, LeaseOwner.local_process("new-holder"), 30_000)
    Settle.together([settle for _, settle in collected.children])
    assert [supervisor.wait(handles[i], timeout=5).state for i in (0, 2)] == ["exited", "exited"]
    assert registry.get(taken).state == "running"  # the new holder records how it ended
    assert registry.get_lease(taken) is not None
    assert registry.verify().ok


@pytest.mark.parametrize("keep_orphans", [False, True])
def test_restore_finds_a_child_whose_start_was_never_recorded(
    registry: ProcessRegistry, owner: LeaseOwner, procs: Processes, keep_orphans: bool
) -> None:
    """The supervisor died between a spawn and its ``started`` write (a batch widens that
    window to a whole batch): the record is ``starting``, with no child on it, and the child
    runs. ``restore`` finds it by the run's marker, stops it (or, with ``keep_orphans``,
    leaves it running) and says so in the record."""
    dead = dead_owner(owner.owner_id)
    registration = command_registration(f"left-{uuid.uuid4().hex[:8]}", ["sleep", "600"])
    record, lease = registry.register_claimed(registration, dead, 10**9)
    assert lease is not None  # held "for ages": its holder is provably dead, not expired
    marker = event_ids(record.id, record.registration_hash).run_marker
    child = subprocess.Popen(
        ["sleep", "600"], env={**os.environ, "PROCLEDGER_RUN": marker}, start_new_session=True
    )
    spawned = procs.add(child.pid)
    with Supervisor(registry, owner=owner, stop=StopPolicy(grace_s=5.0)) as supervisor:
        restored = supervisor.restore(keep_orphans=keep_orphans)
    assert [(r.id, r.state) for r in restored] == [(record.id, "lost_on_restore")]
    diagnostic = restored[0].diagnostic
    assert diagnostic is not None
    if keep_orphans:
        assert child.poll() is None
        assert diagnostic.endswith(
            f"is gone; OS pid {child.pid} carrying its run marker (spawned, but its start was "
            "never recorded) was left running unsupervised (keep_orphans)"
        )
        child.kill()
        child.wait(timeout=30)
        return
    child.wait(timeout=30)
    Processes.assert_dead(spawned)
    assert diagnostic.endswith(
        f"is gone; restore stopped OS pid {child.pid} carrying its run marker: spawned, but its "
        "start was never recorded"
    )
