"""Recovery throughput: 1,000 rerunnable processes recovered by 1, 2 and 4 worker OS processes
sharing one PostgreSQL schema, beside one worker on a SQLite file. Medians of several rounds.

    export PROCLEDGER_TEST_POSTGRES_URL=postgresql://...     (or pass --postgres URL)
    PYTHONPATH=src python benchmarks/recovery.py [--rounds 3] [--processes 1000] [--workers 1,2,4]

Each round registers the processes afresh (a new schema or file), starts the workers -- forked
from one interpreter, each with its own registry -- waits until every one is ready, releases
them together and times until the last one has finished its sweep. Every process is run exactly
once (checked). The work is an engine that returns at once (``--work command`` runs ``true``
instead), so the figures are the ledger's cost per recovery: three transactions -- the claim
(``claim_next_free``), ``started``, ``completed`` with the lease -- 13 round trips on PostgreSQL,
six of them while the append holds the events-table lock that serialises every writer
(docs/design.md §7.3). ``--work sleep`` waits 50 ms instead:
work that is I/O-bound, which more workers should finish proportionally faster. "Skipped
visits" counts processes a worker looked at and left (held by another): 0 when work is shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import orjson

from _common import postgres_ledger, sqlite_ledger
from procledger import (
    Lease,
    LeaseOwner,
    LeaseTimings,
    Originator,
    ProcessInput,
    ProcessRecord,
    ProcessRegistration,
    RecoveryDisposition,
    open_registry,
)
from procledger.recovery import RecoveryWorker, RunResult

TIMINGS = LeaseTimings(ttl_ms=30_000, renew_ms=10_000)


SLEEP_S = 0.05


def noop(record: ProcessRecord, lease: Lease, cancel: threading.Event) -> RunResult:
    return RunResult()


def nap(record: ProcessRecord, lease: Lease, cancel: threading.Event) -> RunResult:
    """Work that waits (I/O-bound): what adding workers should speed up."""
    cancel.wait(SLEEP_S)
    return RunResult()


# -- the worker side (a child of this script) ------------------------------------------------------


def _say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def _work(url: str, index: int, gate: int) -> None:
    registry = open_registry(url)
    try:
        worker = RecoveryWorker(
            registry,
            LeaseOwner.local_process(f"bench-{index}"),
            timings=TIMINGS,
            engines={"noop": noop, "sleep": nap},
        )
        _say("ready")
        os.read(gate, 1)
        cpu_before = time.process_time()
        report = worker.sweep()
        counts = {name: len(getattr(report, name)) for name in type(report).model_fields}
        counts["cpu_ms"] = round((time.process_time() - cpu_before) * 1000)
        _say("report " + orjson.dumps(counts).decode())
    finally:
        registry.close()


def serve_workers(url: str, count: int) -> int:
    """Fork ``count`` workers, release them on a line from stdin, wait for them all."""
    gates, children = [], []
    for index in range(count):
        start, gate = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(gate)
            code = 0
            try:
                _work(url, index, start)
            except BaseException as exc:  # report and exit non-zero; the parent checks
                sys.stderr.write(f"worker {index}: {exc!r}\n")
                code = 1
            os._exit(code)
        os.close(start)
        gates.append(gate)
        children.append(pid)
    sys.stdin.readline()
    for gate in gates:
        os.write(gate, b"g")
    return max(os.waitpid(pid, 0)[1] for pid in children) and 1


# -- the driver ------------------------------------------------------------------------------------


def _register(url: str, processes: int, work: str) -> None:
    registry = open_registry(url)
    try:
        env_ref = registry.store_env({"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        spec = {
            "engine": ProcessInput.engine("noop"),
            "sleep": ProcessInput.engine("sleep"),
            "command": ProcessInput.command(["true"]),
        }[work]
        for index in range(processes):
            registry.register(
                ProcessRegistration(
                    id=f"job-{index:05}",
                    input=spec,
                    disposition=RecoveryDisposition.rerunnable,
                    originator=Originator.host(),
                    env_ref=env_ref,
                )
            )
    finally:
        registry.close()


def _check_all_done(url: str, processes: int) -> None:
    registry = open_registry(url)
    try:
        store = registry._store
        with store.read() as tx:
            row = tx.execute(
                f"SELECT COUNT(*) AS n FROM {store.table('records')} WHERE status='completed'"
            ).one()
        assert int(row["n"]) == processes, (row["n"], processes)
    finally:
        registry.close()


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def one_round(
    url: str, workers: int, processes: int, work: str
) -> tuple[float, float, list[dict[str, int]]]:
    """Seconds from release to the last report, the machine's CPU use meanwhile (0..1), and
    each worker's counts."""
    import subprocess

    _register(url, processes, work)
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", url, str(workers)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None
    assert child.stdout is not None
    for _ in range(workers):
        assert child.stdout.readline() == "ready\n"
    busy_before, total_before = _cpu_ticks()
    started = time.perf_counter()
    child.stdin.write("go\n")
    child.stdin.flush()
    reports = [orjson.loads(child.stdout.readline().split(" ", 1)[1]) for _ in range(workers)]
    elapsed = time.perf_counter() - started
    busy_after, total_after = _cpu_ticks()
    cpu = (busy_after - busy_before) / max(1, total_after - total_before)
    child.stdin.close()
    assert child.wait() == 0
    child.stdout.close()
    assert sum(r["ran"] for r in reports) == processes, reports  # each exactly once
    assert sum(r["failed"] + r["lost"] for r in reports) == 0, reports
    _check_all_done(url, processes)
    return elapsed, cpu, reports


def measure(
    label: str,
    make_url: Callable[[], AbstractContextManager[str]],
    *,
    workers: int,
    processes: int,
    rounds: int,
    work: str,
) -> float:
    rates, skipped, cpu, worker_cpu = [], [], [], []
    for _ in range(rounds):
        with make_url() as url:
            elapsed, used, reports = one_round(url, workers, processes, work)
        rates.append(processes / elapsed)
        cpu.append(used)
        skipped.append(sum(r["skipped"] for r in reports))
        worker_cpu.append(sum(r["cpu_ms"] for r in reports) / processes)
    rate = statistics.median(rates)
    print(
        f"{label:<12} {workers} worker(s): {rate:6.0f} processes/s  "
        f"(rounds: {', '.join(f'{r:.0f}' for r in rates)}; "
        f"machine CPU busy {statistics.median(cpu):.0%}; "
        f"worker CPU {statistics.median(worker_cpu):.1f} ms/process; "
        f"skipped visits per round: {statistics.median(skipped):.0f})",
        flush=True,
    )
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", nargs=2, metavar=("URL", "COUNT"), help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=1000)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--work", choices=["engine", "sleep", "command"], default="engine")
    parser.add_argument("--postgres", default=os.environ.get("PROCLEDGER_TEST_POSTGRES_URL"))
    args = parser.parse_args()
    if args.serve:
        sys.exit(serve_workers(args.serve[0], int(args.serve[1])))

    print(
        f"recovering {args.processes} rerunnable processes ({args.work} work), "
        f"median of {args.rounds} rounds; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    counts = [int(n) for n in args.workers.split(",")]
    sizes = {"processes": args.processes, "rounds": args.rounds}
    sqlite_rate = measure("SQLite file", sqlite_ledger, workers=1, work=args.work, **sizes)
    if not args.postgres:
        print("PostgreSQL skipped: set $PROCLEDGER_TEST_POSTGRES_URL or pass --postgres URL")
        return
    pg = {
        n: measure(
            "PostgreSQL", lambda: postgres_ledger(args.postgres), workers=n, work=args.work, **sizes
        )
        for n in counts
    }
    base = pg[counts[0]]
    print("scaling on PostgreSQL: " + ", ".join(f"{n}: {pg[n] / base:.2f}x" for n in counts))
    print(f"PostgreSQL, {counts[0]} worker(s) / SQLite, 1 worker: {base / sqlite_rate:.2f}x")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
