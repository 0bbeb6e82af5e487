"""The Supervisor beside ``subprocess``, side by side in one run: medians, calls interleaved.

    PYTHONPATH=src python benchmarks/supervisor.py [--calls N] [--cli-calls N] [--postgres URL]

(a) ``Supervisor.start(["true"])`` → terminal recorded, on a SQLite file (the embedded default),
    beside ``subprocess.run(["true"])``; the same on ``memory://`` (no fsync: what is left is
    CPU) and, with ``--postgres``, on PostgreSQL. Also lists the durable writes (store write
    transactions) one supervised ``true`` needs, by the registry operation that made each, and
    the floor on the same file in the same run: ``subprocess.run`` plus three raw sqlite3
    commits of the same rows (the same bytes per transaction), and plus the outbox put's two
    fsyncs (an entry's size, in the same state folder) -- what no code can go below while
    each commit is durable and the outcome is put in the outbox.
(b) ``procledger run -- true`` (a whole CLI process) beside ``subprocess.run(["true"])``, and
    beside ``procledger table`` (the interpreter, the CLI and the domain model; no store, no
    supervisor), so the share of the store, the supervisor and the run itself is visible.
(c) 100 processes supervised concurrently (``sleep 0.2`` each): wall time from the first
    ``start`` to the last terminal recorded, beside 100 ``subprocess.Popen`` + ``wait``.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import interleaved, median_ms, timed
from procledger import LeaseOwner, ProcessRegistry, open_registry
from procledger.supervisor.supervisor import Supervisor

CONCURRENT = 100


def raw_true() -> None:
    subprocess.run(["true"], check=False)


def supervised(registry: ProcessRegistry) -> Supervisor:
    return Supervisor(registry, owner=LeaseOwner.local_process("benchmark"))


def library(url: str, calls: int) -> tuple[float, float]:
    registry = open_registry(url)
    try:
        with supervised(registry) as supervisor:

            def one() -> None:
                supervisor.wait(supervisor.start(["true"]))

            for _ in range(5):
                one()  # warm up: imports, prepared statements, page cache
            return interleaved(one, raw_true, calls)
    finally:
        registry.close()


@contextlib.contextmanager
def counting_writes(registry: ProcessRegistry) -> Iterator[Counter[str]]:
    """Count write transactions, each named by the registry or supervisor call that made it."""
    counts: Counter[str] = Counter()
    store = registry._store
    original = store.begin  # every transaction, whether through write() or attempt()

    @contextlib.contextmanager
    def begin(write: bool) -> Iterator[Any]:
        if write:
            counts[_caller()] += 1
        with original(write) as tx:
            yield tx

    store.begin = begin
    try:
        yield counts
    finally:
        store.begin = original


def _caller() -> str:
    for frame in inspect.stack()[2:]:
        module = frame.frame.f_globals.get("__name__", "")
        if module in {
            "procledger.application.registry",
            "procledger.application.handle_addresses",
        } and not frame.function.startswith(("_", "<")):
            return f"{module.rsplit('.', 1)[-1]}.{frame.function}"
    return "other"


def durable_writes(url: str) -> Counter[str]:
    registry = open_registry(url)
    try:
        with supervised(registry) as supervisor:
            supervisor.wait(supervisor.start(["true"]))
            with counting_writes(registry) as counts:
                supervisor.wait(supervisor.start(["true"]))
        return counts
    finally:
        registry.close()


def transaction_sizes(path: Path) -> list[list[int]]:
    """The bytes of each row one supervised ``true`` wrote, per write transaction: its events
    (registered + first_started, started, output_captured + completed), each beside the
    record row it rewrote. Read from the newest process in the ledger."""
    db = sqlite3.connect(path)
    try:
        (record,) = db.execute(
            "SELECT length(record) FROM procledger_records ORDER BY change_seq DESC LIMIT 1"
        ).fetchone()
        states = [
            n
            for (n,) in db.execute(
                "SELECT length(state) FROM stored_events WHERE originator_id = "
                "(SELECT originator_id FROM stored_events ORDER BY rowid DESC LIMIT 1) "
                "ORDER BY originator_version"
            )
        ]
    finally:
        db.close()
    return [[*states[:2], record], [states[2], record], [*states[3:], record]]


class Floor:
    """The durable I/O of one supervised run with no code around it, on the same file."""

    def __init__(self, path: Path, sizes: list[list[int]], outbox: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("CREATE TABLE IF NOT EXISTS floor_rows (id INTEGER PRIMARY KEY, v BLOB)")
        self.rows = [[(os.urandom(n),) for n in sizes_of_tx] for sizes_of_tx in sizes]
        self.outbox, self.entry = outbox, os.urandom(700)

    def commits(self) -> None:
        for rows in self.rows:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.executemany("INSERT INTO floor_rows (v) VALUES (?)", rows)
            self.db.execute("COMMIT")

    def put(self) -> None:
        """An outbox entry's put (temp, fsync, rename, folder fsync) and its unlink."""
        temp, final = self.outbox / ".floor.tmp", self.outbox / "floor.json"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, self.entry)
        os.fsync(fd)
        os.close(fd)
        os.replace(temp, final)
        folder = os.open(self.outbox, os.O_RDONLY)
        os.fsync(folder)
        os.close(folder)
        final.unlink()


def floors(url: str, path: Path, calls: int) -> tuple[float, float, float, float]:
    """Medians (ms) of supervised, run + 3 commits, run + 3 commits + outbox put, and run,
    interleaved in one loop on the same file."""
    from procledger.adapters.outbox import default_outbox

    registry = open_registry(url)
    try:
        with supervised(registry) as supervisor:
            for _ in range(5):
                supervisor.wait(supervisor.start(["true"]))
            floor = Floor(path, transaction_sizes(path), default_outbox().directory)

            def ours() -> None:
                supervisor.wait(supervisor.start(["true"]))

            def commits() -> None:
                raw_true()
                floor.commits()

            def with_put() -> None:
                commits()
                floor.put()

            samples = [
                (timed(ours), timed(commits), timed(with_put), timed(raw_true))
                for _ in range(calls)
            ]
            floor.db.close()
    finally:
        registry.close()
    ours_ms, commits_ms, put_ms, raw_ms = (median_ms(s[i] for s in samples) for i in range(4))
    return ours_ms, commits_ms, put_ms, raw_ms


def cli(url: str, calls: int) -> tuple[float, float, float]:
    run = [sys.executable, "-m", "procledger", "--url", url, "run", "--", "true"]
    table = [sys.executable, "-m", "procledger", "table"]
    for _ in range(2):
        subprocess.run(run, check=True)
    samples = [
        (
            timed(lambda: subprocess.run(run, check=True)),
            timed(lambda: subprocess.run(table, check=True, stdout=subprocess.DEVNULL)),
            timed(raw_true),
        )
        for _ in range(calls)
    ]
    run_ms, table_ms, raw_ms = (median_ms(s[i] for s in samples) for i in range(3))
    return run_ms, table_ms, raw_ms


def concurrent(url: str) -> tuple[float, float]:
    argv = ["sleep", "0.2"]
    registry = open_registry(url)
    try:
        with supervised(registry) as supervisor:
            started = time.perf_counter()
            handles = [supervisor.start(argv) for _ in range(CONCURRENT)]
            for handle in handles:
                supervisor.wait(handle)
            ours = time.perf_counter() - started
    finally:
        registry.close()
    started = time.perf_counter()
    children = [subprocess.Popen(argv) for _ in range(CONCURRENT)]
    for child in children:
        child.wait()
    theirs = time.perf_counter() - started
    return ours * 1e3, theirs * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100, help="library calls per comparison")
    parser.add_argument("--cli-calls", type=int, default=10, help="CLI runs per comparison")
    parser.add_argument("--postgres", metavar="URL", help="also measure this PostgreSQL ledger")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        sqlite = f"sqlite:///{Path(folder) / 'ledger.db'}"
        stores = [("sqlite", sqlite), ("memory", "memory://")]
        if args.postgres:
            stores.append(("postgresql", args.postgres))
        print(f"(a) Supervisor start -> terminal of `true`, medians of {args.calls} calls")
        for name, url in stores:
            ours, theirs = library(url, args.calls)
            print(
                f"    {name:<10} supervised {ours:8.2f} ms   subprocess.run {theirs:6.2f} ms"
                f"   ratio {ours / theirs:6.1f}x   overhead {ours - theirs:7.2f} ms"
            )
        counts = durable_writes(sqlite)
        print(f"    durable writes of one supervised `true`: {sum(counts.values())}")
        for caller, count in counts.items():
            print(f"      {count} x {caller}")
        ours, commits, put, raw = floors(sqlite, Path(folder) / "ledger.db", args.calls)
        print(f"    the floor on the same SQLite file, medians of {args.calls} interleaved rounds:")
        print(
            f"      supervised {ours:6.2f} ms ({ours / raw:4.1f}x)   subprocess.run + 3 raw "
            f"commits {commits:6.2f} ms ({commits / raw:4.1f}x)   + outbox put "
            f"{put:6.2f} ms ({put / raw:4.1f}x)   subprocess.run {raw:5.2f} ms"
        )
        run, table, raw = cli(sqlite, args.cli_calls)
        print(f"(b) `procledger run -- true` on SQLite, medians of {args.cli_calls} runs")
        print(
            f"    run {run:8.1f} ms   `procledger table` {table:8.1f} ms   subprocess.run "
            f"{raw:5.2f} ms   ratio {run / raw:7.1f}x (vs table: {run / table:4.2f}x)"
        )
        ours, theirs = concurrent(sqlite)
        print(f"(c) {CONCURRENT} x `sleep 0.2` at once, first start to last terminal (SQLite)")
        print(
            f"    supervised {ours:8.1f} ms   Popen+wait {theirs:8.1f} ms   "
            f"ratio {ours / theirs:5.2f}x   per process {(ours - theirs) / CONCURRENT:5.2f} ms"
        )


if __name__ == "__main__":
    main()
