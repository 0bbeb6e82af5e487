"""The SQLite store's own connections: shared by threads, few kept open, all closed with the
registry, never shared with a forked child."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import threading
from pathlib import Path

import pytest

from procledger import ProcessRegistry, StoreError, open_registry
from procledger.adapters.sql.sqlite import SQLiteBackend, SQLiteConnections

from .conformance import registration


@pytest.fixture
def registry_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


def connections(registry: ProcessRegistry) -> SQLiteConnections:
    backend = registry._store.backend
    assert isinstance(backend, SQLiteBackend)
    return backend.connections


def is_open(connection: sqlite3.Connection) -> bool:
    try:
        connection.execute("SELECT 1")
    except sqlite3.ProgrammingError:  # "Cannot operate on a closed database."
        return False
    return True


def test_a_thread_reuses_the_connection_it_gave_back(registry: ProcessRegistry) -> None:
    registry.register(registration("p"))
    with registry._store.read() as tx:
        first = tx.cursor.connection
    registry.record_started("p", 1)
    with registry._store.write() as tx:
        assert tx.cursor.connection is first


def test_a_nested_transaction_gets_its_own_connection(registry: ProcessRegistry) -> None:
    with registry._store.write() as outer, registry._store.read() as inner:
        assert inner.cursor.connection is not outer.cursor.connection


def test_threads_share_the_idle_connections_and_few_stay_open(registry: ProcessRegistry) -> None:
    """Many threads, each inside a transaction at once, open one connection each; once they
    are done at most ``_KEPT_IDLE`` stay open, and the next transaction reuses one of them."""
    count = SQLiteConnections._KEPT_IDLE + 4
    inside, done = threading.Barrier(count + 1), threading.Event()
    opened: list[sqlite3.Connection] = []

    def hold() -> None:
        with registry._store.read() as tx:
            opened.append(tx.cursor.connection)
            inside.wait(timeout=30)
            done.wait(timeout=30)

    threads = [threading.Thread(target=hold) for _ in range(count)]
    for thread in threads:
        thread.start()
    inside.wait(timeout=30)
    done.set()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    assert len(set(map(id, opened))) == count
    still_open = [connection for connection in opened if is_open(connection)]
    assert len(still_open) == SQLiteConnections._KEPT_IDLE
    with registry._store.read() as tx:
        assert any(tx.cursor.connection is connection for connection in still_open)


def test_closing_the_registry_closes_every_connection(tmp_path: Path) -> None:
    registry = open_registry(f"sqlite:///{tmp_path / 'ledger.db'}")
    registry.register(registration("p"))
    opened: list[sqlite3.Connection] = []
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with registry._store.read() as tx:
            opened.append(tx.cursor.connection)
        held.set()
        release.wait(timeout=30)

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(timeout=30)
    with registry._store.read() as tx:
        opened.append(tx.cursor.connection)
    registry.close()
    release.set()
    thread.join(timeout=30)
    assert len(opened) == 2
    assert not any(is_open(connection) for connection in opened)
    with pytest.raises(StoreError, match="closed"):
        registry.get("p")


def test_closing_while_another_thread_writes_lets_that_write_finish(tmp_path: Path) -> None:
    registry = open_registry(f"sqlite:///{tmp_path / 'ledger.db'}")
    inside, proceed = threading.Event(), threading.Event()
    outcome: list[object] = []

    def write() -> None:
        try:
            with registry._store.write() as tx:
                inside.set()
                assert proceed.wait(timeout=30)
                envs = registry._store.table("envs")
                tx.execute(f"INSERT INTO {envs} (env_ref, env) VALUES ('e', '{{}}')")
                outcome.append(tx.cursor.connection)
        except BaseException as error:  # reported below, on the test's thread
            outcome.append(error)

    thread = threading.Thread(target=write)
    thread.start()
    assert inside.wait(timeout=30)
    registry.close()
    proceed.set()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert len(outcome) == 1
    assert isinstance(outcome[0], sqlite3.Connection), outcome
    assert not is_open(outcome[0])
    reopened = open_registry(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        assert reopened.load_env("e") == {}
    finally:
        reopened.close()


def _child_reads(
    registry: ProcessRegistry,
    parent_connections: set[int],
    results: multiprocessing.SimpleQueue[object],
) -> None:
    """In a forked child, with the registry object the parent had opened."""
    with registry._store.read() as tx:
        results.put(id(tx.cursor.connection) in parent_connections)
    results.put(registry.get("p").id)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_never_uses_the_parents_connections(registry: ProcessRegistry) -> None:
    registry.register(registration("p"))
    with registry._store.read() as tx:
        parent_connections = {id(tx.cursor.connection)}
    context = multiprocessing.get_context("fork")
    results: multiprocessing.SimpleQueue[object] = context.SimpleQueue()
    child = context.Process(target=_child_reads, args=(registry, parent_connections, results))
    child.start()
    try:
        child.join(timeout=60)
        assert child.exitcode == 0
        assert results.get() is False
        assert results.get() == "p"
    finally:
        if child.is_alive():
            child.kill()
            child.join()
    registry.record_started("p", 1)  # the parent's connections still work
