"""The Supervisor beside ``subprocess``, side by side in one run: medians, calls interleaved.

    PYTHONPATH=src python benchmarks/supervisor.py [--calls N] [--cli-calls N] [--postgres URL]

(a) ``Supervisor.start(["true"])`` → terminal recorded, on a SQLite file (the embedded default),
    beside ``subprocess.run(["true"])``; the same on ``memory://`` (no fsync: what is left is
    CPU) and, with ``--postgres``, on PostgreSQL. Also lists the durable writes (store write
    transactions) one supervised ``true`` needs, by the registry operation that made each.
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
    store = registry.store
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
            "procledger.supervisor.handles",
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
