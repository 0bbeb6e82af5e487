"""The reads that must stay fast at 100,000 processes go through an index, on both stores.

Each read below runs for real against a small ledger while its SELECT statements are captured;
each captured statement is then EXPLAINed with the same parameters. The plans must not scan a
whole table, nor sort one to give an ordered page: a first page then costs its own rows,
whatever the size of the ledger (``benchmarks/scale.py`` measures it; docs/design.md §5.2).

PostgreSQL would pick a sequential scan or a sort for a table this small, so the plans are
asked for with sequential scans, bitmap scans and sorts priced out (``SET LOCAL enable_* =
off``): what remains is the plan the indexes allow, and a sort or full scan left in it means
no index can serve the read. An incremental sort over an index whose prefix gives the order is
allowed (the feed's ``change_seq`` is unique per record, so its groups hold one row each).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from tests.projections._support import finish, registration

from procledger import LeaseOwner, ProcessRegistry, open_registry
from procledger.adapters.sql.store import Store, Tx
from procledger.testing import FakeClock

OWNER = LeaseOwner(owner_id="plans", incarnation_id="1")
SESSION = "s-plans"
PROCESSES = 60
PG_PLANNER_OFF = ("enable_seqscan", "enable_bitmapscan", "enable_sort")

READS: dict[str, Callable[[ProcessRegistry], object]] = {
    "ps (running, by id)": lambda r: r.scan_processes(),
    "ps --all --limit 50 (newest page)": lambda r: r.scan_processes(
        {"status": "any"}, limit=50, newest_first=True
    ),
    "list by label": lambda r: r.list_processes(
        {"status": "any", "identity_label": "make"}, limit=50
    ),
    "forward page deep in the list": lambda r: r.list_processes(
        {"status": "any"}, limit=10, after="p-00040"
    ),
    "running page after an id": lambda r: r.list_processes(limit=10, after="p-00005"),
    "feed first page": lambda r: r.scan_changes(0, 20),
    "feed page from a middle cursor": lambda r: r.scan_changes(PROCESSES, 20),
    "handle summaries of a session": lambda r: r.handles(SESSION, {"status": "any"}),
    "one handle": lambda r: r.handle(SESSION, "p-00003"),
    "resolve_process_id by prefix": lambda r: r.resolve_process_id("p-00012"),
    "get": lambda r: r.get("p-00007"),
}


def populate(registry: ProcessRegistry) -> None:
    """Mostly ended processes, some running, a session holding handles to some."""
    for index in range(PROCESSES):
        process_id = f"p-{index:05d}"
        registry.register(registration(process_id))
        if index % 3 == 0:
            registry.grant_handle(SESSION, process_id)
        if index % 10 == 0:
            registry.record_first_started(process_id, OWNER, registry.now_ms())
            registry.record_started(process_id, 100 + index)
        else:
            finish(registry, process_id)


def captured_selects(
    monkeypatch: pytest.MonkeyPatch, registry: ProcessRegistry, read: Callable[..., object]
) -> list[tuple[str, tuple[Any, ...]]]:
    """The SELECT statements (with their parameters) that ``read(registry)`` runs."""
    seen: list[tuple[str, tuple[Any, ...]]] = []
    execute = Tx.execute

    def spy(tx: Tx, statement: str, params: Sequence[Any] = ()) -> Tx:
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append((statement, tuple(params)))
        return execute(tx, statement, params)

    with monkeypatch.context() as patch:
        patch.setattr(Tx, "execute", spy)
        read(registry)
    return seen


def plan_of(store: Store, statement: str, params: tuple[Any, ...]) -> list[str]:
    with store.read() as tx:
        if tx.dialect.name == "postgresql":
            for setting in PG_PLANNER_OFF:
                tx.execute(f"SET LOCAL {setting} = off")
            rows = tx.execute("EXPLAIN " + statement, params).all()
            return [str(next(iter(dict(row).values()))) for row in rows]
        rows = tx.execute("EXPLAIN QUERY PLAN " + statement, params).all()
        return [str(row["detail"]) for row in rows]


def plan_problems(dialect: str, statement: str, plan: list[str]) -> list[str]:
    """What in ``plan`` reads a whole table or sorts one, if anything."""
    bounded = " LIMIT " in statement
    problems: list[str] = []
    for line in plan:
        if dialect == "sqlite":
            full_scan = line.startswith("SCAN ") and not ("USING" in line and bounded)
            if full_scan or "TEMP B-TREE" in line:
                problems.append(line)
        elif "Seq Scan" in line or re.match(r"^\s*(->\s*)?Sort\s+\(", line):
            problems.append(line.strip())
    return problems


def test_every_read_uses_an_index(shared_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = open_registry(shared_url, clock=FakeClock())
    try:
        populate(registry)
        dialect = registry._store.dialect.name
        failures: list[str] = []
        for name, read in READS.items():
            statements = captured_selects(monkeypatch, registry, read)
            assert statements, f"{name} ran no SELECT"
            for statement, params in statements:
                plan = plan_of(registry._store, statement, params)
                if plan_problems(dialect, statement, plan):
                    failures.append(f"{name} on {dialect}: {statement}\n  " + "\n  ".join(plan))
        assert not failures, "\n".join(failures)
    finally:
        registry.close()


def test_the_checker_sees_a_full_scan_and_a_sort(shared_url: str) -> None:
    """The rule above is not vacuous: an unindexed filter and an unindexed order fail it."""
    registry = open_registry(shared_url, clock=FakeClock())
    try:
        populate(registry)
        table = registry._store.table("records")
        statement = f"SELECT process_id FROM {table} WHERE updated_at_ms>? ORDER BY record LIMIT ?"
        plan = plan_of(registry._store, statement, (0, 5))
        assert plan_problems(registry._store.dialect.name, statement, plan)
    finally:
        registry.close()
