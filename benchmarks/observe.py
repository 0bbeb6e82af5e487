"""What watching costs (issue 32; docs/design.md §16.1, §16.3, §16.4, §18.10), each beside the
floor of doing the same read with raw sqlite3 or psutil, in the same run.

    PYTHONPATH=src python benchmarks/observe.py [--processes 10000] [--children 200] [--quick]

1. ``/metrics``: the collector's first scrape of a ledger of ``--processes`` finished
   processes (it reads the whole feed and decodes each record) beside raw sqlite3 reading and
   decoding every record's JSON; then a scrape with nothing new beside raw sqlite3's
   ``MAX(change_seq)`` (the least a scrape must ask).
2. The timeline: ``GET /api/timeline?window=1h``'s read (``read_window``: the window's records,
   of the newest 5,000 changes at most) beside raw sqlite3 reading and decoding the same rows.
3. The counts' first reading (``StatusCounts`` over the feed) beside raw sqlite3's
   ``SELECT status, COUNT(*) ... GROUP BY status``.
4. A round of the agent's resource sampler over ``--children`` sleeping children beside
   psutil asking each child for the same four figures.

Medians of interleaved calls: the machine is noisy.
"""

from __future__ import annotations

import argparse
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import orjson
import psutil
from prometheus_client import CollectorRegistry, generate_latest

from _common import interleaved, sqlite_ledger
from procledger import open_registry
from procledger.agent.resources import ResourceSampler
from procledger.application.metrics import LedgerCollector
from procledger.web.hub import feed_head
from procledger.web.timeline import MOST_CHANGES, read_window
from procledger.web.views import StatusCounts
from startup import populate

HOUR_MS = 3_600_000


def line(what: str, ours: float, floor: float, baseline: str) -> None:
    print(f"{what:<44} {ours:9.2f} ms   {baseline} {floor:9.2f} ms   ×{ours / floor:6.1f}")


def raw_records(path: str, since_ms: int = 0, newest: int = -1) -> list[object]:
    """Every record changed since ``since_ms`` (of the ``newest`` changes, if not -1)."""
    with sqlite3.connect(path) as raw:
        rows = raw.execute(
            "SELECT record FROM procledger_records WHERE updated_at_ms >= ? "
            "ORDER BY change_seq DESC LIMIT ?",
            (since_ms, newest),
        ).fetchall()
    raw.close()
    return [orjson.loads(row[0]) for row in rows]


def raw_one(path: str, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as raw:
        rows = raw.execute(sql).fetchall()
    raw.close()
    return rows


def first_scrape(url: str) -> Callable[[], bytes]:
    def scrape() -> bytes:
        registry = open_registry(url)
        try:
            collectors = CollectorRegistry()
            collectors.register(LedgerCollector(registry))
            return generate_latest(collectors)
        finally:
            registry.close()

    return scrape


def first_counts(url: str) -> Callable[[], dict[str, int]]:
    def count() -> dict[str, int]:
        registry = open_registry(url)
        try:
            counts, cursor = StatusCounts(), 0
            while True:
                page = registry.scan_changes(cursor, 500)
                for record in page.records:
                    counts.add(record)
                cursor = max(cursor, int(page.cursor))
                if len(page.records) + len(page.damaged) < 500:
                    return counts.counts()
        finally:
            registry.close()

    return count


def ledger_figures(url: str, path: str, calls: int) -> None:
    ours, floor = interleaved(first_scrape(url), lambda: raw_records(path), calls)
    line("/metrics, first scrape (every record)", ours, floor, "sqlite3 read+decode all")
    registry = open_registry(url)
    try:
        collectors = CollectorRegistry()
        collectors.register(LedgerCollector(registry))
        generate_latest(collectors)
        ours, floor = interleaved(
            lambda: generate_latest(collectors),
            lambda: raw_one(path, "SELECT MAX(change_seq) FROM procledger_records"),
            calls * 5,
        )
        line("/metrics, a scrape with nothing new", ours, floor, "sqlite3 MAX(change_seq)")
        head = feed_head(registry)
        now = registry.now_ms()
        ours, floor = interleaved(
            lambda: read_window(registry, HOUR_MS, now, head),
            lambda: raw_records(path, now - HOUR_MS, MOST_CHANGES),
            calls,
        )
        line("timeline, 1 h window (≤ 5,000 changes)", ours, floor, "sqlite3 read+decode same")
    finally:
        registry.close()
    ours, floor = interleaved(
        first_counts(url),
        lambda: raw_one(path, "SELECT status, COUNT(*) FROM procledger_records GROUP BY status"),
        calls,
    )
    line("counts per status, first reading", ours, floor, "sqlite3 GROUP BY status")


@contextmanager
def sleeping(count: int) -> Iterator[dict[str, int]]:
    children = [subprocess.Popen(["sleep", "600"]) for _ in range(count)]
    try:
        yield {f"p{index}": child.pid for index, child in enumerate(children)}
    finally:
        for child in children:
            child.kill()
        for child in children:
            child.wait()


def psutil_round(children: dict[str, int]) -> list[tuple[float, int, int, int]]:
    figures = []
    for pid in children.values():
        process = psutil.Process(pid)
        with process.oneshot():
            times = process.cpu_times()
            figures.append(
                (
                    times.user + times.system,
                    process.memory_info().rss,
                    process.num_threads(),
                    process.num_fds(),
                )
            )
    return figures


def sampler_figures(count: int, calls: int) -> None:
    with sleeping(count) as children:
        sampler = ResourceSampler()
        ours, floor = interleaved(
            lambda: sampler.sample(children), lambda: psutil_round(children), calls
        )
        line(f"resource sampler, a round of {count} children", ours, floor, "psutil per child ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=10_000)
    parser.add_argument("--children", type=int, default=200)
    parser.add_argument("--calls", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="2,000 processes, 50 children")
    args = parser.parse_args()
    processes, children = (2_000, 50) if args.quick else (args.processes, args.children)
    with sqlite_ledger() as url:
        started = time.perf_counter()
        populate(url, processes)
        print(
            f"a ledger of {processes:,} finished processes ({time.perf_counter() - started:.0f} s)"
        )
        ledger_figures(url, url.removeprefix("sqlite:///"), args.calls)
    sampler_figures(children, args.calls)


if __name__ == "__main__":
    main()
