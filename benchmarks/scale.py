"""First-page latencies of the reads on a ledger of 100,000 processes and 1,000,000 events.

    PYTHONPATH=src python benchmarks/scale.py [--processes 100000] [--rounds 7]
        [--ledger PATH] [--postgres-url URL] [--schema NAME] [--rebuild] [--verify]
        [--skip-sqlite]

The ledger is built once and kept: a SQLite file under ``~/.cache/procledger-bench/`` (or
``--ledger``) and a PostgreSQL schema (``--schema``), both named after the format version and
the size, so a changed generator never reuses an old ledger. ``--rebuild`` builds them again.
A build goes through procledger's own write path in batches (``Ledger.save`` of 1,000
aggregates per transaction: events, hash chain, heads and read models together), then checks
the ledger with ``registry.verify()``; it is built under a temporary name and renamed when
done, so an interrupted build is never reused. On this 2-core machine a build takes about 2
minutes on SQLite and 7 on PostgreSQL, and its verify 3 and 2.5; a run on kept ledgers, a
minute or two.

The mix: about 97% ended processes (registered, first_started, started, six producer events of
a declared type, completed = 10 events), every 33rd process still running (3 lifecycle events
and 3 producer events), 100 labels (``tool-0`` .. ``tool-99``), and every 10th process's handle
granted to one of 100 sessions (a session event each).

Each read runs as the library runs it, ``--rounds`` times alternating with the raw floor: the
same SELECT statements with the same parameters on a plain driver connection, rows fetched
and not decoded. Medians and ranges in ms; target: each first page < 100 ms.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

from _common import conninfo, drop_schemas, with_schema
from procledger import (
    AmbiguousProcessId,
    CompletionAuthority,
    EventType,
    LeaseOwner,
    Originator,
    ProcessInput,
    ProcessRegistration,
    ProcessRegistry,
    RecoveryDisposition,
    SessionScope,
    open_registry,
)
from procledger.adapters.sql.store import Tx
from procledger.domain.process import Process
from procledger.domain.registration import env_ref_for
from procledger.domain.session import Session

FORMAT = 1
"""Bump when the generated ledger changes: cached ledgers of another format are not reused."""
RUNNING_EVERY = 33
GRANT_EVERY = 10
SESSIONS = 100
LABELS = 100
PRODUCER_EVENTS = (6, 3)
"""Producer events of an ended process, of a running one."""
BATCH = 1_000
TARGET_MS = 100.0
BASE_MS = 1_780_000_000_000
ENV_REF = env_ref_for({"PATH": "/usr/bin"})
AUTHORITY = CompletionAuthority.workflow_key("scale")
OWNER = LeaseOwner(owner_id="scale", incarnation_id="1")


def process_id(index: int) -> str:
    """A readable id with a short hash, so a prefix of 12 characters names one process."""
    return f"job-{index:08d}-{hashlib.sha1(str(index).encode()).hexdigest()[:6]}"


# -- building ----------------------------------------------------------------------------------


def _process(index: int, at_ms: int) -> Process:
    registration = ProcessRegistration(
        id=process_id(index),
        input=ProcessInput.command([f"/usr/bin/tool-{index % LABELS}", f"step-{index % 7}"]),
        disposition=RecoveryDisposition.owner_bound,
        originator=Originator.session(SessionScope(session_id=f"s{index % SESSIONS}")),
        env_ref=ENV_REF,
        event_types=[EventType(name="signal.progress")],
        definition={"workflow": "build", "step": index % 7} if index % 3 else None,
    )
    process = Process.register(registration, at_ms=at_ms)
    process.record_first_started(OWNER, at_ms, at_ms=at_ms)
    process.record_started(40_000 + index, at_ms=at_ms, event_id=None)
    running = index % RUNNING_EVERY == 0
    for step in range(PRODUCER_EVENTS[running]):
        process.append_producer_event(
            "signal.progress", {"step": step}, replay_key=f"p{step}", at_ms=at_ms
        )
    if not running:
        process.complete(
            "exited", "exited", exit_code=0, diagnostic=None, value={"ok": True},
            event_id=None, authority=AUTHORITY, at_ms=at_ms,
        )  # fmt: skip
    return process


def build(registry: ProcessRegistry, processes: int) -> None:
    """Append the ledger in batches of ``BATCH`` processes, one transaction each."""
    sessions: dict[str, Session] = {}
    for start in range(0, processes, BATCH):
        at_ms = BASE_MS + start * 10
        indexes = range(start, min(processes, start + BATCH))
        batch = [_process(index, at_ms) for index in indexes]
        touched: dict[str, Session] = {}
        for index in indexes[::GRANT_EVERY]:
            session_id = f"s{index // GRANT_EVERY % SESSIONS}"
            session = sessions.get(session_id) or Session.open(session_id, at_ms=at_ms)
            sessions[session_id] = touched[session_id] = session
            session.grant(process_id(index), {"kind": "command", "label": "tool"}, at_ms=at_ms)
        registry._ledger.save(batch, list(touched.values()), now_ms=at_ms)


def count_events(registry: ProcessRegistry) -> int:
    with registry._store.read() as tx:
        row = tx.execute(f"SELECT COUNT(*) AS n FROM {tx.dialect.events_table}").one()
    return int(row["n"])


def feed_tip(registry: ProcessRegistry) -> int:
    with registry._store.read() as tx:
        row = tx.execute(f"SELECT MAX(change_seq) AS tip FROM {tx.dialect.table('records')}").one()
    return int(row["tip"] or 0)


def build_and_check(url: str, processes: int) -> None:
    """Build the ledger at ``url`` and verify it (both timed, printed)."""
    registry = open_registry(url)
    try:
        started = time.perf_counter()
        build(registry, processes)
        built = time.perf_counter() - started
        events = count_events(registry)
        print(f"  built {processes:,} processes, {events:,} events in {built:.0f} s "
              f"({events / built:,.0f} events/s)")  # fmt: skip
        verify(registry)
    finally:
        registry.close()


def verify(registry: ProcessRegistry) -> None:
    started = time.perf_counter()
    report = registry.verify()
    print(f"  verify: {'ok' if report.ok else 'FAILED'} in {time.perf_counter() - started:.0f} s")
    if not report.ok:
        raise SystemExit(f"the built ledger does not verify: {report}")


# -- keeping the ledgers -------------------------------------------------------------------------


def sqlite_url(args: argparse.Namespace) -> str:
    """The cached SQLite ledger (built first when missing or ``--rebuild``)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "procledger-bench"
    path = Path(args.ledger or cache / f"scale-v{FORMAT}-{args.processes}.db")
    if args.rebuild and path.exists():
        path.unlink()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".building")
        for leftover in path.parent.glob(partial.name + "*"):
            leftover.unlink()
        print(f"sqlite: building {path}")
        build_and_check(f"sqlite:///{partial}", args.processes)
        partial.rename(path)
    return f"sqlite:///{path}"


def postgres_url(args: argparse.Namespace) -> str:
    """The kept PostgreSQL schema (built first when missing or ``--rebuild``)."""
    import psycopg

    schema = args.schema or f"procledger_scale_v{FORMAT}_{args.processes}"
    partial = schema + "_building"
    if args.rebuild:
        drop_schemas(args.postgres_url, [schema])
    with psycopg.connect(conninfo(args.postgres_url), autocommit=True) as conn:
        found = conn.execute(
            "SELECT 1 FROM information_schema.schemata WHERE schema_name=%s", (schema,)
        ).fetchone()
    if found is None:
        drop_schemas(args.postgres_url, [partial])
        print(f"postgresql: building schema {schema}")
        build_and_check(with_schema(args.postgres_url, partial), args.processes)
        with psycopg.connect(conninfo(args.postgres_url), autocommit=True) as conn:
            conn.execute(f'ALTER SCHEMA "{partial}" RENAME TO "{schema}"')
            conn.execute(f'ANALYZE "{schema}".procledger_records')
    return with_schema(args.postgres_url, schema)


# -- the reads -----------------------------------------------------------------------------------


def reads(processes: int, tip: int) -> dict[str, Callable[[ProcessRegistry], int]]:
    """Each read as an application or the CLI makes it; each returns how many rows it gave."""
    deep = process_id(processes * 9 // 10)
    one = processes // 2 + 1
    return {
        "ps (every running process)": lambda r: len(r.scan_processes().records),
        "ps --limit 50 (running, newest)": lambda r: len(
            r.scan_processes(limit=50, newest_first=True).records
        ),
        "ps --all --limit 50 (newest page)": lambda r: len(
            r.scan_processes({"status": "any"}, limit=50, newest_first=True).records
        ),
        "list_processes by label, 50": lambda r: len(
            r.list_processes({"status": "any", "identity_label": "tool-42"}, limit=50)
        ),
        "list_processes after= (90% deep), 50": lambda r: len(
            r.list_processes({"status": "any"}, limit=50, after=deep)
        ),
        "feed: first page of 100": lambda r: len(r.scan_changes(0, 100).records),
        "feed: page of 100 from mid cursor": lambda r: len(r.scan_changes(tip // 2, 100).records),
        "handles of a session (any status)": lambda r: len(r.handles("s42", {"status": "any"})),
        "handles of a session (running)": lambda r: len(r.handles("s42")),
        "resolve_process_id (12-char prefix)": lambda r: resolve(r, process_id(one)[:12]),
        "get one process": lambda r: int(r.get(process_id(one)).id == process_id(one)),
    }


def resolve(registry: ProcessRegistry, prefix: str) -> int:
    with suppress(AmbiguousProcessId):
        registry.resolve_process_id(prefix)
        return 1
    return 0


def captured(registry: ProcessRegistry, read: Callable[[ProcessRegistry], int]) -> list[Any]:
    """The SELECTs ``read`` runs, in the driver's placeholder style, with their parameters."""
    seen: list[tuple[str, tuple[Any, ...]]] = []
    execute = Tx.execute

    def spy(self: Tx, statement: str, params: Sequence[Any] = ()) -> Tx:
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append((self.dialect.statement(statement), tuple(params)))
        return execute(self, statement, params)

    Tx.execute = spy  # type: ignore[method-assign]
    try:
        read(registry)
    finally:
        Tx.execute = execute  # type: ignore[method-assign]
    return seen


class Raw:
    """A plain driver connection that runs captured statements and fetches the rows."""

    def __init__(self, url: str) -> None:
        if url.startswith("sqlite:///"):
            self.conn: Any = sqlite3.connect(url.removeprefix("sqlite:///"))
        else:
            import psycopg

            self.conn = psycopg.connect(conninfo(url), autocommit=True)

    def run(self, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        for statement, params in statements:
            self.conn.execute(statement, params).fetchall()

    def close(self) -> None:
        self.conn.close()


def measure(
    url: str, processes: int, rounds: int
) -> list[tuple[str, int, list[float], list[float]]]:
    """``(read, rows, our samples, raw samples)`` for each read, alternating ours and raw."""
    registry = open_registry(url)
    raw = Raw(url)
    try:
        results = []
        for name, read in reads(processes, feed_tip(registry)).items():
            statements = captured(registry, read)
            rows = read(registry)
            raw.run(statements)  # warm both
            results.append((name, rows, *alternate(registry, read, raw, statements, rounds)))
        return results
    finally:
        raw.close()
        registry.close()


def alternate(
    registry: ProcessRegistry,
    read: Callable[[ProcessRegistry], int],
    raw: Raw,
    statements: list[Any],
    rounds: int,
) -> tuple[list[float], list[float]]:
    """``rounds`` samples (ms) of the read and of its raw floor, taken turn about."""
    ours, floor = [], []
    for _ in range(rounds):
        ours.append(timed(lambda: read(registry)))
        floor.append(timed(lambda: raw.run(statements)))
    return ours, floor


def timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return (time.perf_counter() - started) * 1e3


def print_table(store: str, results: list[tuple[str, int, list[float], list[float]]]) -> None:
    print(f"\n{store}: first pages, ms (median [min-max] of {len(results[0][2])} rounds)")
    print(f"  {'read':40s} {'rows':>5s}  {'procledger':>22s}  {'raw SQL floor':>13s}  < 100 ms")
    for name, rows, ours, floor in results:
        median = statistics.median(ours)
        spread = f"{median:7.2f} [{min(ours):.1f}-{max(ours):.1f}]"
        verdict = "yes" if median < TARGET_MS else "NO"
        print(f"  {name:40s} {rows:5d}  {spread:>22s}  {statistics.median(floor):13.2f}  {verdict}")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--processes", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--ledger", default=None, help="the SQLite ledger file to build or reuse")
    parser.add_argument("--postgres-url", default=None)
    parser.add_argument("--schema", default=None, help="the PostgreSQL schema to build or reuse")
    parser.add_argument("--rebuild", action="store_true", help="build the ledgers again")
    parser.add_argument("--verify", action="store_true", help="verify a reused ledger too")
    parser.add_argument("--skip-sqlite", action="store_true")
    args = parser.parse_args()
    urls = [] if args.skip_sqlite else [("sqlite", sqlite_url(args))]
    if args.postgres_url:
        urls.append(("postgresql", postgres_url(args)))
    for store, url in urls:
        if args.verify:
            registry = open_registry(url)
            try:
                verify(registry)
            finally:
                registry.close()
        print_table(store, measure(url, args.processes, args.rounds))


if __name__ == "__main__":
    main()
