"""PostgreSQL transactions that save round trips (docs/design.md §7.3): the ``BEGIN`` is the
liveness check of an idle connection, and a batched (pipelined) transaction never reads a
stale row count."""

from __future__ import annotations

import psycopg
import pytest

from procledger import (
    Originator,
    ProcessInput,
    ProcessRegistration,
    RecoveryDisposition,
    open_registry,
)
from procledger.adapters.sql.postgres import PostgresBackend, conninfo
from procledger.testing import FakeClock

pytestmark = pytest.mark.postgres


def _register(registry: object, process_id: str) -> None:
    registry.register(  # type: ignore[attr-defined]
        ProcessRegistration(
            id=process_id,
            input=ProcessInput.external({"label": "x"}),
            disposition=RecoveryDisposition.externally_owned,
            originator=Originator.host(),
        )
    )


def test_a_dead_idle_connection_is_replaced_at_begin_without_the_retry_window(
    postgres_schema_url: str,
) -> None:
    """With no retry window at all, a call after the server ended every idle connection of
    the registry still succeeds: the failed ``BEGIN`` drops the connection before anything of
    the transaction ran, and the next one is opened."""
    registry = open_registry(postgres_schema_url + "&retry_s=0", clock=FakeClock())
    try:
        _register(registry, "a")
        backend = registry._store.backend
        assert isinstance(backend, PostgresBackend)
        connections = backend.connections
        idle = list(connections._idle)  # the connections the next call takes
        assert idle
        pids = [connection.info.backend_pid for connection in idle]
        with psycopg.connect(conninfo(registry._store.location), autocommit=True) as admin:
            for pid in pids:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        _register(registry, "b")
        assert registry.get("b").id == "b"
        assert registry.get("a").id == "a"
    finally:
        registry.close()


def test_a_batched_transaction_reads_the_row_count_of_its_own_statement(
    postgres_schema_url: str,
) -> None:
    registry = open_registry(postgres_schema_url, clock=FakeClock())
    try:
        _register(registry, "a")
        store = registry._store
        table = store.table("records")
        with store.write() as tx:
            tx.batch()
            assert tx.batching
            tx.execute(f"UPDATE {table} SET waiting=0 WHERE process_id=?", ("a",))
            assert tx.rowcount == 1
            tx.execute(f"UPDATE {table} SET waiting=0 WHERE process_id=?", ("nobody",))
            assert tx.rowcount == 0
    finally:
        registry.close()
