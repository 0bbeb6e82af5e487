"""Group commit on a SQLite file (docs/design.md §7.3): writers of one process that are ready
at once share one transaction and one commit; each is acknowledged only after that commit,
and a writer whose own part fails gets its own error while the others commit.

The grouping is made deterministic by a *holder*: a thread inside a write transaction (it
holds the baton) that leaves only once the writers under test are queued behind it."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from procledger import (
    LeaseLost,
    LeaseOwner,
    NotFound,
    ProcessRegistry,
    StoreError,
    StoreUnavailable,
    open_registry,
)
from procledger.adapters.sql import lease_rows
from procledger.adapters.sql import sqlite as sqlite_adapter
from procledger.adapters.sql.group_commit import WriteGroups
from procledger.adapters.sql.sqlite import SQLiteBackend, SQLiteConnections
from procledger.adapters.sql.store import Tx

from .conformance import registration

OWNER = LeaseOwner.local_process("group-commit-test")
WAIT_S = 30


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.db"


@pytest.fixture
def registry_url(path: Path) -> str:
    return f"sqlite:///{path}"


def connections_of(registry: ProcessRegistry) -> SQLiteConnections:
    backend = registry._store.backend
    assert isinstance(backend, SQLiteBackend)
    return backend.connections


def groups_of(registry: ProcessRegistry) -> WriteGroups:
    groups = connections_of(registry).groups
    assert groups is not None
    return groups


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.001)


class Call(threading.Thread):
    """``action()`` in a thread of its own; ``outcome`` is its result or its exception."""

    def __init__(self, action: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.action = action
        self.outcome: Any = None

    def run(self) -> None:
        try:
            self.outcome = self.action()
        except BaseException as error:
            self.outcome = error

    def result(self) -> Any:
        self.join(WAIT_S)
        assert not self.is_alive()
        return self.outcome


def with_queued(registry: ProcessRegistry, body: Callable[[Tx], None], calls: list[Call]) -> Call:
    """A holder running ``body`` in a write transaction that ends only once every one of
    ``calls`` (started here) is queued behind it; returns the holder, started."""
    groups = groups_of(registry)
    inside = threading.Event()

    def hold() -> None:
        with registry._store.write() as tx:
            body(tx)
            inside.set()
            wait_until(lambda: groups.queued == len(calls))

    holder = Call(hold)
    holder.start()
    assert inside.wait(WAIT_S)
    for call in calls:
        call.start()
    return holder


def test_writers_queued_at_once_commit_in_one_transaction(
    registry: ProcessRegistry, path: Path
) -> None:
    groups = groups_of(registry)
    before, writes_before, held_before = groups.commits, groups.writes, groups.held_s
    calls = [Call(lambda i=i: registry.register(registration(f"p{i}"))) for i in range(3)]
    holder = with_queued(registry, lambda tx: None, calls)
    assert holder.result() is None
    assert [call.result().id for call in calls] == ["p0", "p1", "p2"]
    assert groups.commits == before + 1
    assert groups.writes == writes_before + 4  # the holder and the three
    assert groups.held_s > held_before
    fresh = open_registry(f"sqlite:///{path}")
    try:
        assert {fresh.get(f"p{i}").id for i in range(3)} == {"p0", "p1", "p2"}
    finally:
        fresh.close()


def test_a_fenced_out_writer_in_a_group_fails_alone(registry: ProcessRegistry, path: Path) -> None:
    """The holder supersedes the lease (a new holder, fence + 1); a terminal written with the
    old lease in the same group is refused (``LeaseLost``, read from the holder's uncommitted
    row), and the other writer's registration and the new lease commit."""
    _, lease = registry.register_claimed(registration("p"), OWNER, 60_000)
    assert lease is not None
    registry.record_started("p", registry.now_ms())
    groups = groups_of(registry)
    before = groups.commits

    def supersede(tx: Tx) -> None:
        lease_rows.take(
            tx,
            "p",
            owner_json=OWNER.model_dump_json(),
            lease_token="successor",
            fencing_token=lease.fencing_token + 1,
            claimed_at_ms=registry.now_ms(),
            expires_at_ms=registry.now_ms() + 60_000,
        )

    stale = Call(
        lambda: registry.record_completed("p", "exited", "exited", exit_code=0, lease=lease)
    )
    other = Call(lambda: registry.register(registration("q")))
    holder = with_queued(registry, supersede, [stale, other])
    assert holder.result() is None
    assert isinstance(stale.result(), LeaseLost)
    assert other.result().id == "q"
    assert groups.commits == before + 1
    fresh = open_registry(f"sqlite:///{path}")
    try:
        assert fresh.get("q").id == "q"
        assert not fresh.get("p").is_terminal
        current = fresh.get_lease("p")
        assert current is not None
        assert current.fencing_token == lease.fencing_token + 1
    finally:
        fresh.close()


def test_a_first_member_that_fails_is_rolled_back_whole_and_the_queued_commit(
    registry: ProcessRegistry,
) -> None:
    """The first member of a group has no savepoint (a lone writer runs what it ran before):
    its failure rolls back its own transaction, and the writers queued behind it commit."""
    registry.register(registration("p"))
    groups = groups_of(registry)
    queued = Call(lambda: registry.register(registration("q")))

    def fails(tx: Tx) -> None:
        lease_rows.ensure_locked(tx, "p")
        queued.start()
        wait_until(lambda: groups.queued == 1)
        raise ValueError("the first member's own failure")

    holder = Call(lambda: _write(registry, fails))
    holder.start()
    assert isinstance(holder.result(), ValueError)
    assert queued.result().id == "q"
    with registry._store.read() as tx:
        assert lease_rows.lease_row(tx, "p") is None


def test_an_error_that_ends_the_whole_transaction_fails_every_member(
    registry: ProcessRegistry, path: Path
) -> None:
    """SQLite rolls a transaction back by itself on some errors (a full disk, an I/O error):
    the writes of every member are then gone, and none is acknowledged."""
    registry.register(registration("p"))

    def claim(tx: Tx) -> None:
        lease_rows.ensure_locked(tx, "p")

    def breaks_it(tx: Tx) -> None:
        tx.cursor.connection.rollback()  # as SQLite does on SQLITE_FULL
        raise sqlite3.OperationalError("database or disk is full")

    breaker = Call(lambda: _write(registry, breaks_it))
    holder = with_queued(registry, claim, [breaker])
    assert isinstance(holder.result(), StoreUnavailable)
    assert isinstance(breaker.result(), StoreUnavailable)
    with registry._store.read() as tx:
        assert lease_rows.lease_row(tx, "p") is None
    assert registry.register(registration("q")).id == "q"  # the next group is a fresh one


def _write(registry: ProcessRegistry, body: Callable[[Tx], None]) -> None:
    with registry._store.write() as tx:
        body(tx)


class FailingCommit(sqlite3.Connection):
    def commit(self) -> None:
        raise sqlite3.OperationalError("disk I/O error")


def test_a_failed_commit_fails_every_member_and_keeps_nothing(
    registry: ProcessRegistry, path: Path
) -> None:
    connections = connections_of(registry)

    def failing() -> sqlite3.Connection:
        connection = sqlite3.connect(
            path, factory=FailingCommit, isolation_level=None, check_same_thread=False
        )
        connection.row_factory = sqlite3.Row
        return connection

    connections.groups = WriteGroups(failing, lambda connection: connection.close())
    calls = [Call(lambda i=i: registry.register(registration(f"p{i}"))) for i in range(2)]
    holder = with_queued(registry, lambda tx: None, calls)
    assert isinstance(holder.result(), StoreUnavailable)
    assert all(isinstance(call.result(), StoreUnavailable) for call in calls)
    fresh = open_registry(f"sqlite:///{path}")
    try:
        for i in range(2):
            with pytest.raises(NotFound):
                fresh.get(f"p{i}")
    finally:
        fresh.close()


def test_a_write_begun_inside_another_on_the_same_thread_is_refused_at_once(
    registry: ProcessRegistry,
) -> None:
    with registry._store.write(), pytest.raises(StoreError, match="inside another"):
        registry.register(registration("p"))
    assert registry.register(registration("p")).id == "p"  # the baton was handed on


def test_a_writer_waits_for_the_others_no_longer_than_for_sqlites_lock(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_adapter, "LOCK_TIMEOUT_S", 0.2)
    registry = open_registry(f"sqlite:///{path}")
    try:
        late = Call(lambda: registry.register(registration("p")))

        def hold(tx: Tx) -> None:  # the baton is held until the late writer gave up
            late.start()
            late.join(WAIT_S)

        holder = Call(lambda: _write(registry, hold))
        holder.start()
        assert holder.result() is None
        error = late.result()
        assert isinstance(error, StoreUnavailable)
        assert "ledger.db" in str(error)
        assert registry.register(registration("p")).id == "p"
    finally:
        registry.close()


WRITER = """
import sys, threading
from procledger import Originator, ProcessInput, ProcessRegistration, open_registry
from procledger import RecoveryDisposition
registry = open_registry(sys.argv[1])
def registration(process_id):
    return ProcessRegistration(
        id=process_id,
        input=ProcessInput.external({"n": 1}),
        disposition=RecoveryDisposition.externally_owned,
        originator=Originator.host(),
    )
lock = threading.Lock()
def write(worker):
    for index in range(10**6):
        process_id = f"w{worker}-{index}"
        registry.register(registration(process_id))
        with lock:
            print(process_id, flush=True)
threads = [threading.Thread(target=write, args=(worker,)) for worker in range(6)]
for thread in threads:
    thread.start()
for thread in threads:  # a writer that fails ends the script: the test sees the end
    thread.join()
"""


def test_no_acknowledged_write_is_lost_when_the_writer_is_killed(path: Path) -> None:
    """Six threads write as fast as they can (grouped); each id is printed once its call
    returned. SIGKILL at an arbitrary moment: every printed id is in the ledger."""
    url = f"sqlite:///{path}"
    open_registry(url).close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, url], stdout=subprocess.PIPE, text=True, env=env
    )
    acknowledged: list[str] = []
    try:
        assert child.stdout is not None
        while len(acknowledged) < 300:
            line = child.stdout.readline()
            assert line, "the writer ended early"
            acknowledged.append(line.strip())
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(WAIT_S)
    assert child.stdout is not None
    with child.stdout:
        acknowledged += [line.strip() for line in child.stdout.read().splitlines() if line]
    registry = open_registry(url)
    try:
        missing = []
        for process_id in acknowledged:
            try:
                registry.get(process_id)
            except NotFound:
                missing.append(process_id)
        assert missing == []
    finally:
        registry.close()
