"""Projections side by side in one run: rebuild against a raw scan of the same log, and lag.

    PYTHONPATH=src python benchmarks/projections.py [--events 200000] [--big-events 1000000]
        [--rounds 3] [--lag-samples 200] [--postgres-url URL] [--skip-big]

(a) rebuild throughput: ``registry.rebuild()`` (events applied per second) beside a raw
    scan-and-decode of the same notification log (``recorder.select_notifications`` in pages
    of 1,000 and ``mapper.to_domain_event`` for each) — alternating, several rounds, medians;
    target: rebuild >= 75% of raw. SQLite, and PostgreSQL when ``--postgres-url`` is given.
    The log is generated with its read models (as a registry writes them), so each round
    rebuilds a sound read model: rows equal to their rebuild are compared, not rewritten.
(b) memory: peak RSS (``resource.getrusage``) of a fresh OS process that opens the ledger and
    rebuilds it, at ``--events`` and at ``--big-events`` (SQLite) — flat means the same. Every
    heavy step runs in its own child process and the parent stays small, because Linux carries
    the parent's high-water mark into a child's ``ru_maxrss`` across fork and exec.
(c) feed lag: a writer OS process registers a process every 20 ms and reports when each write
    returned; this process follows ``changes_since`` (polling every 5 ms when idle) and notes
    when each appears. Median and p99 of (seen - written); target p99 < 250 ms.

Events are generated through the registry's real save path (aggregates, events, read-model
rows in one transaction per batch): each process is registered, first-started, started, emits
``signal.ready`` and completes (5 events), and its handle is granted to one of 50 sessions (1
event), so 6 events per process.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import postgres_ledger, sqlite_ledger
from procledger import (
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
from procledger.domain.process import Process
from procledger.domain.registration import env_ref_for
from procledger.domain.session import Session
from procledger.projections import ChangeCursor

EVENTS_PER_PROCESS = 6
SESSIONS = 50
BATCH = 500
ENV_REF = env_ref_for({"PATH": "/usr/bin"})
AUTHORITY = CompletionAuthority.workflow_key("bench")
OWNER = LeaseOwner(owner_id="bench", incarnation_id="1")
HERE = Path(__file__).resolve()


# -- generating a log ------------------------------------------------------------------------


def _registration(index: int) -> ProcessRegistration:
    return ProcessRegistration(
        id=f"job-{index:08d}",
        input=ProcessInput.command(["/usr/bin/make", f"step-{index % 7}"], cwd="/srv/build"),
        disposition=RecoveryDisposition.owner_bound,
        originator=Originator.session(SessionScope(session_id=f"s{index % SESSIONS}")),
        env_ref=ENV_REF,
        event_types=[EventType(name="signal.ready")],
        definition={"workflow": "build", "step": index % 7} if index % 3 else None,
    )


def generate(registry: ProcessRegistry, events: int) -> int:
    """Append about ``events`` events; returns how many processes were created."""
    processes = -(-events // EVENTS_PER_PROCESS)
    now = registry.now_ms()
    sessions: dict[str, Session] = {}
    for start in range(0, processes, BATCH):
        batch: list[Process] = []
        touched: dict[str, Session] = {}
        for index in range(start, min(processes, start + BATCH)):
            process = Process.register(_registration(index), at_ms=now)
            process.record_first_started(OWNER, now, at_ms=now)
            process.record_started(now, at_ms=now, event_id=None)
            process.append_producer_event("signal.ready", {"n": index}, replay_key="r", at_ms=now)
            process.complete(
                "exited",
                "exited",
                exit_code=0,
                diagnostic=None,
                value={"ok": True},
                event_id=None,
                authority=AUTHORITY,
                at_ms=now,
            )
            batch.append(process)
            session_id = f"s{index % SESSIONS}"
            session = sessions.get(session_id) or Session.open(session_id, at_ms=now)
            sessions[session_id] = touched[session_id] = session
            session.grant(process.process_id, {"kind": "command", "label": "make"}, at_ms=now)
        registry._ledger.save(batch, list(touched.values()), now_ms=now)
    return processes


# -- (a) rebuild against raw -------------------------------------------------------------------


def raw_scan(registry: ProcessRegistry) -> int:
    count, start = 0, 1
    while True:
        page = registry._ledger.recorder.select_notifications(start, 1_000)
        if not page:
            return count
        for item in page:
            registry._ledger.mapper.to_domain_event(item)
        count += len(page)
        start = page[-1].id + 1


def timed(work: Callable[[], int]) -> tuple[int, float, float]:
    """``(result, wall seconds, CPU seconds of this process)``."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = work()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def throughput(url: str, rounds: int) -> dict[str, Any]:
    """Alternating rounds; wall-clock rates, and the ratio of this process's CPU time too
    (steadier on a shared machine; it leaves out the database server's own work)."""
    registry = open_registry(url)
    try:
        raw_rates, rebuild_rates, ratios, cpu_ratios = [], [], [], []
        for _ in range(rounds):
            count, raw_wall, raw_cpu = timed(lambda: raw_scan(registry))
            applied, rebuild_wall, rebuild_cpu = timed(lambda: registry.rebuild().applied)
            assert applied == count, (applied, count)
            raw_rates.append(count / raw_wall)
            rebuild_rates.append(applied / rebuild_wall)
            ratios.append(raw_wall / rebuild_wall)
            cpu_ratios.append(raw_cpu / rebuild_cpu)
        return {
            "events": count,
            "raw": statistics.median(raw_rates),
            "rebuild": statistics.median(rebuild_rates),
            "ratio": statistics.median(ratios),
            "ratios": ratios,
            "cpu_ratio": statistics.median(cpu_ratios),
        }
    finally:
        registry.close()


# -- (b) memory --------------------------------------------------------------------------------


def _child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(HERE.parents[1] / "src")}


def child(*args: str, timeout: float = 3_600) -> dict[str, Any]:
    """Run this script in a fresh OS process; its last stdout line is JSON."""
    done = subprocess.run(
        [sys.executable, str(HERE), "--child", *args],
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"child {args[0]} failed:\n{done.stderr}")
    return dict(json.loads(done.stdout.splitlines()[-1]))


def child_generate(url: str, events: int) -> dict[str, Any]:
    registry = open_registry(url)
    try:
        started = time.perf_counter()
        processes = generate(registry, events)
        return {"processes": processes, "seconds": time.perf_counter() - started}
    finally:
        registry.close()


def child_rebuild(url: str) -> dict[str, Any]:
    registry = open_registry(url)
    try:
        opened_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        applied, seconds, _ = timed(lambda: registry.rebuild().applied)
        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {"events": applied, "seconds": seconds, "opened_kb": opened_kb, "peak_kb": peak_kb}
    finally:
        registry.close()


# -- (c) feed lag ----------------------------------------------------------------------------------


def feed_tip(registry: ProcessRegistry) -> int:
    """Where the feed ends now (paging there would decode every record on the way)."""
    store = registry._store
    with store.read() as tx:
        row = tx.execute(f"SELECT MAX(change_seq) AS tip FROM {store.table('records')}").one()
    return int(row["tip"] or 0)


def child_lag_writer(url: str, samples: int) -> None:
    """Register one process every 20 ms; print ``{"id", "t"}`` after each write returns."""
    registry = open_registry(url)
    try:
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        sys.stdin.readline()
        for index in range(samples):
            process_id = f"lag-{index:05d}"
            registry.register(
                ProcessRegistration(
                    id=process_id,
                    input=ProcessInput.external({"label": "lag"}),
                    disposition=RecoveryDisposition.externally_owned,
                    originator=Originator.host(),
                )
            )
            written = time.monotonic_ns()
            sys.stdout.write(json.dumps({"id": process_id, "t": written}) + "\n")
            sys.stdout.flush()
            time.sleep(0.02)
        sys.stdout.write("done\n")
        sys.stdout.flush()
    finally:
        registry.close()


def feed_lag(url: str, samples: int) -> dict[str, float]:
    registry = open_registry(url)
    cursor = ChangeCursor(feed_tip(registry))
    writer = subprocess.Popen(
        [sys.executable, str(HERE), "--child", "lag-writer", url, str(samples)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_child_env(),
    )
    seen: dict[str, int] = {}
    try:
        assert writer.stdin is not None
        assert writer.stdout is not None
        assert writer.stdout.readline() == "ready\n"
        writer.stdin.write("go\n")
        writer.stdin.flush()
        deadline = time.monotonic() + samples * 0.02 + 120
        while len(seen) < samples and time.monotonic() < deadline:
            page, cursor = registry.changes_since(cursor, 100)
            now = time.monotonic_ns()
            for record in page:
                seen.setdefault(record.id, now)
            if not page:
                time.sleep(0.005)
        written = {}
        for line in writer.stdout:
            if line.startswith("{"):
                entry = json.loads(line)
                written[entry["id"]] = entry["t"]
        writer.wait(timeout=60)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
        registry.close()
    lags = sorted((seen[pid] - t) / 1e6 for pid, t in written.items() if pid in seen)
    assert len(lags) == samples, f"saw {len(lags)} of {samples} writes"
    return {
        "median_ms": statistics.median(lags),
        "p99_ms": statistics.quantiles(lags, n=100, method="inclusive")[98],
        "max_ms": lags[-1],
    }


# -- stores -------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--big-events", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lag-samples", type=int, default=200)
    parser.add_argument("--postgres-url", default=None)
    parser.add_argument("--skip-big", action="store_true")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child(args.child)
        return
    stores: list[tuple[str, Any]] = [("sqlite", sqlite_ledger())]
    if args.postgres_url:
        stores.append(("postgresql", postgres_ledger(args.postgres_url)))
    for name, opener in stores:
        with opener as url:
            report_store(name, url, args)
    if not args.skip_big:
        with sqlite_ledger("big.db") as url:
            generated = child("generate", url, str(args.big_events))
            memory = child("rebuild", url)
            seconds = generated["seconds"]
            print(f"sqlite  generated {args.big_events:,} events in {seconds:.0f} s")
            print_memory("sqlite", memory)


def print_memory(name: str, memory: dict[str, Any]) -> None:
    print(
        f"{name:7s} rebuild {memory['events']:>9,} events in a fresh process: peak RSS "
        f"{memory['peak_kb'] / 1024:6.1f} MB (after opening: {memory['opened_kb'] / 1024:.1f} MB)"
        f", {memory['events'] / memory['seconds']:,.0f} events/s"
    )


def report_store(name: str, url: str, args: argparse.Namespace) -> None:
    generated = child("generate", url, str(args.events))
    print(
        f"{name:7s} generated {generated['processes'] * EVENTS_PER_PROCESS:,} events "
        f"({generated['processes']:,} processes) in {generated['seconds']:.1f} s"
    )
    rates = child("throughput", url, str(args.rounds))
    print(
        f"{name:7s} raw scan-and-decode {rates['raw']:>9,.0f} events/s | rebuild "
        f"{rates['rebuild']:>9,.0f} events/s | ratio {rates['ratio']:.2f} "
        f"(rounds: {', '.join(f'{r:.2f}' for r in rates['ratios'])}; by CPU time "
        f"{rates['cpu_ratio']:.2f}; target >= 0.75)"
    )
    print_memory(name, child("rebuild", url))
    lag = feed_lag(url, args.lag_samples)
    print(
        f"{name:7s} feed lag over {args.lag_samples} writes: median {lag['median_ms']:.1f} ms, "
        f"p99 {lag['p99_ms']:.1f} ms, max {lag['max_ms']:.1f} ms (target p99 < 250 ms)"
    )
    sys.stdout.flush()


def run_child(argv: list[str]) -> None:
    mode, url, *rest = argv
    if mode == "generate":
        print(json.dumps(child_generate(url, int(rest[0]))))
    elif mode == "throughput":
        print(json.dumps(throughput(url, int(rest[0]))))
    elif mode == "rebuild":
        print(json.dumps(child_rebuild(url)))
    elif mode == "lag-writer":
        child_lag_writer(url, int(rest[0]))
    else:
        raise SystemExit(f"unknown child mode {mode!r}")


if __name__ == "__main__":
    main()
