"""The async API beside bare asyncio, side by side in one run (docs/design.md §17).

    PYTHONPATH=src python benchmarks/async_supervise.py [--children N] [--rounds N]
        [--store sqlite|memory] [--capture] [--threads N] [--postgres URL] [--changes N]

(a) N background children (``sleep 1``, N=500) started concurrently from one event loop by an
    ``AsyncSupervisor`` and awaited until every terminal is recorded, beside the same with
    bare ``asyncio.create_subprocess_exec`` + ``wait``: wall time of each (rounds alternate
    which goes first) and the most threads the process had at any moment (sampled every 5 ms
    by a task on the loop, so the sampler adds no thread). Capture is off unless
    ``--capture`` (the bare side keeps no output either). On a SQLite file, also its write
    path: the writes, the commits they shared, and how long the group-commit baton was held
    (the writes run one after another: near the wall time, they are the bound).
(b) With ``--postgres``: a writer OS process registers ``--changes`` processes (2 ms apart),
    each carrying the time just before its write; ``follow`` in this process receives them.
    Latency = arrival - that time; median, p99 and max, and whether any was missed or twice.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from functools import partial
from pathlib import Path

import anyio

from _common import create_schema, drop_schemas, new_schema_name, sqlite_ledger, with_schema
from procledger import LeaseOwner, ProcessRegistry, open_registry
from procledger.aio import AsyncSupervisor, follow

HERE = Path(__file__).resolve()


class Threads:
    """The most threads seen, sampled by a task of the loop."""

    def __init__(self) -> None:
        self.most = threading.active_count()

    async def sample(self) -> None:
        while True:
            self.most = max(self.most, threading.active_count())
            await anyio.sleep(0.005)


async def measured(body: Callable[[], Awaitable[None]]) -> tuple[float, int]:
    threads = Threads()
    async with anyio.create_task_group() as group:
        group.start_soon(threads.sample)
        started = time.perf_counter()
        await body()
        took = time.perf_counter() - started
        group.cancel_scope.cancel()
    return took, threads.most


async def bare(children: int) -> None:
    procs = [await asyncio.create_subprocess_exec("sleep", "1") for _ in range(children)]
    await asyncio.gather(*(p.wait() for p in procs))


async def supervised(
    url: str, children: int, capture: bool, threads: int, notes: list[str]
) -> None:
    registry = open_registry(url)
    try:
        owner = LeaseOwner.local_process("benchmark")
        async with AsyncSupervisor(registry, owner=owner, threads=threads) as sup:

            async def one() -> None:
                handle = await sup.start(["sleep", "1"], background=True, capture=capture)
                record = await handle.wait()
                assert record.state == "exited", record

            async with anyio.create_task_group() as group:
                for _ in range(children):
                    group.start_soon(one)
        notes.append(write_path(registry))
    finally:
        registry.close()


def write_path(registry: ProcessRegistry) -> str:
    """How busy the write path was (a SQLite file: its group commit, docs/design.md §7.3):
    the writes go one after another, so a baton held for most of the wall time is the bound."""
    connections = getattr(registry._store.backend, "connections", None)
    groups = getattr(connections, "groups", None)  # a SQLite file's only
    if groups is None:
        return ""
    per_commit = groups.writes / max(groups.commits, 1)
    return (
        f"; {groups.writes} writes in {groups.commits} commits ({per_commit:.1f} each), "
        f"baton held {groups.held_s:.2f} s"
    )


async def supervise_round(store: str, children: int, capture: bool, threads: int) -> list[str]:
    lines = []
    for first in ("bare", "procledger"), ("procledger", "bare"):
        results: dict[str, tuple[float, int]] = {}
        notes: list[str] = []
        for side in first:
            if side == "bare":
                results[side] = await measured(lambda: bare(children))
            elif store == "memory":
                results[side] = await measured(
                    partial(supervised, "memory://", children, capture, threads, notes)
                )
            else:
                with sqlite_ledger() as url:
                    results[side] = await measured(
                        partial(supervised, url, children, capture, threads, notes)
                    )
        (ours, our_threads), (theirs, their_threads) = results["procledger"], results["bare"]
        lines.append(
            f"  {children} x sleep 1 ({store}, capture {'on' if capture else 'off'}): "
            f"AsyncSupervisor {ours:.3f} s, {our_threads} threads at most{''.join(notes)}; "
            f"bare asyncio {theirs:.3f} s, {their_threads} threads; ratio {ours / theirs:.2f}x"
        )
    return lines


def write_changes(url: str, prefix: str, count: int) -> None:
    """The writer OS process of (b)."""
    from procledger import Originator, ProcessInput, ProcessRegistration, RecoveryDisposition

    registry = open_registry(url)
    try:
        sys.stdin.readline()  # go
        for index in range(count):
            registry.register(
                ProcessRegistration(
                    id=f"{prefix}-{index:05d}",
                    input=ProcessInput.external({"t": time.time()}),
                    disposition=RecoveryDisposition.externally_owned,
                    originator=Originator.host(),
                )
            )
            time.sleep(0.002)  # pacing: about 400 changes/s with the write itself
    finally:
        registry.close()


async def feed_lag(url: str, changes: int) -> str:
    registry = open_registry(url)
    prefix = f"w{uuid.uuid4().hex[:6]}"
    lags: list[float] = []
    seen: set[str] = set()
    twice = 0
    argv = [sys.executable, str(HERE), "--write", url, prefix, str(changes)]
    writer = await anyio.open_process(argv, stdin=subprocess.PIPE, stderr=None, stdout=None)
    try:
        start = registry.changes_since(0, 10**9)[1]
        async with aclosing(follow(registry, start)) as feed:
            assert writer.stdin is not None
            await writer.stdin.send(b"go\n")
            with anyio.fail_after(120):
                async for change in feed:
                    record = change.record
                    if not record.id.startswith(prefix):
                        continue
                    metadata = record.input.metadata
                    assert isinstance(metadata, dict)
                    lags.append(time.time() - float(metadata["t"]))  # type: ignore[arg-type]
                    twice += record.id in seen
                    seen.add(record.id)
                    if len(seen) == changes:
                        break
        await writer.wait()
    finally:
        registry.close()
    lags.sort()
    p99 = lags[min(len(lags) - 1, int(len(lags) * 0.99))]
    return (
        f"  feed lag, PostgreSQL, {changes} changes from another OS process: median "
        f"{statistics.median(lags) * 1e3:.1f} / p99 {p99 * 1e3:.1f} / max {lags[-1] * 1e3:.1f} "
        f"ms; missed {changes - len(seen)}, twice {twice}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--children", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--store", choices=("sqlite", "memory"), default="sqlite")
    parser.add_argument("--capture", action="store_true")
    parser.add_argument("--threads", type=int, default=3, help="AsyncSupervisor(threads=)")
    parser.add_argument("--postgres")
    parser.add_argument("--changes", type=int, default=1000)
    args = parser.parse_args()
    for _ in range(args.rounds if args.children else 0):
        lines = anyio.run(supervise_round, args.store, args.children, args.capture, args.threads)
        for line in lines:
            print(line, flush=True)
    if args.postgres:
        schema = new_schema_name()
        create_schema(args.postgres, schema)
        try:
            url = with_schema(args.postgres, schema)
            open_registry(url).close()  # create the tables before the writer races for them
            print(anyio.run(feed_lag, url, args.changes), flush=True)
        finally:
            drop_schemas(args.postgres, [schema])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"]:
        write_changes(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()
