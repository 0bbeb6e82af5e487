"""How long a PostgreSQL restart holds writers up: time from the server accepting connections
again to the first successful write, under four writer threads (issue 13; target < 1 s).

    PYTHONPATH=src python benchmarks/pg_restart.py --postgres-url URL [--mode fast|immediate]
        [--rounds N]

Runs as root on the machine that hosts the cluster (``pg_ctl`` runs as ``postgres``), e.g. the
throwaway test cluster of ``.ci/pg-dev``. Each round restarts the server with ``pg_ctl restart
-m MODE`` while the writers register and start processes; "ready" is the first moment a fresh
connection succeeds (polled every 5 ms), "resumed" the first write any writer completes after
it. Failed calls are counted too (the target is none).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

from _common import conninfo, postgres_ledger
from procledger import ProcessRegistration, open_registry

WRITERS = 4


def registration(process_id: str) -> ProcessRegistration:
    return ProcessRegistration.model_validate(
        {
            "id": process_id,
            "input": {"type": "external", "metadata": {"label": "bench"}},
            "disposition": "externally_owned",
            "originator": {"type": "host"},
        }
    )


class Writers:
    """Four threads writing until stopped; completion times and failures."""

    def __init__(self, url: str) -> None:
        self.registry = open_registry(url)
        self.done: list[float] = []
        self.failures: list[BaseException] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(n,)) for n in range(WRITERS)]

    def run(self, n: int) -> None:
        index = 0
        while not self.stop.is_set():
            process_id = f"w{n}-{uuid.uuid4().hex[:8]}-{index}"
            try:
                self.registry.register(registration(process_id))
                self.registry.record_started(process_id, index, event_id=str(uuid.uuid4()))
            except Exception as error:  # counted, not raised: the benchmark reports them
                self.failures.append(error)
            self.done.append(time.monotonic())
            index += 1

    def __enter__(self) -> Writers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=120)
        self.registry.close()


def data_directory(url: str) -> str:
    parts = urlsplit(url)
    admin = f"host={parts.hostname} port={parts.port or 5432} user=postgres dbname=postgres"
    with psycopg.connect(admin) as conn:
        row = conn.execute("SHOW data_directory").fetchone()
    assert row is not None
    return str(row[0])


def restart(data: str, mode: str) -> None:
    pg_ctl = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))[-1]
    log = f"/tmp/procledger-bench-pg-{os.getpid()}.log"
    command = ["runuser", "-u", "postgres", "--", str(pg_ctl), "restart", "-D", data]
    command += ["-m", mode, "-l", log, "-W"]  # -W: return at once; readiness is polled
    subprocess.run(command, check=True, capture_output=True, timeout=120)


def ready_at(libpq: str, deadline_s: float = 120.0) -> float:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            with psycopg.connect(libpq, connect_timeout=1):
                return time.monotonic()
        except psycopg.Error:
            time.sleep(0.005)
    raise TimeoutError("the server did not come back")


def one_round(url: str, data: str, mode: str) -> tuple[float, int]:
    with Writers(url) as writers:
        while len(writers.done) < 20:
            time.sleep(0.01)
        restart(data, mode)
        ready = ready_at(conninfo(url).split("?", 1)[0])
        while not any(at > ready for at in writers.done):
            if time.monotonic() - ready > 60:
                raise TimeoutError("no write within 60 s of the server being ready")
            time.sleep(0.001)
        resumed = min(at for at in writers.done if at > ready)
    return resumed - ready, len(writers.failures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres-url", default=os.environ.get("PROCLEDGER_TEST_POSTGRES_URL"))
    parser.add_argument("--mode", choices=["fast", "immediate"], action="append")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not args.postgres_url:
        parser.error("--postgres-url (or $PROCLEDGER_TEST_POSTGRES_URL) is required")
    data = data_directory(args.postgres_url)
    for mode in args.mode or ["fast", "immediate"]:
        gaps, failed = [], 0
        for _ in range(args.rounds):
            with postgres_ledger(args.postgres_url) as url:
                gap, failures = one_round(url, data, mode)
            gaps.append(gap)
            failed += failures
        print(
            f"pg_ctl restart -m {mode:<9} ready -> first write: median "
            f"{statistics.median(gaps) * 1e3:7.1f} ms, max {max(gaps) * 1e3:7.1f} ms "
            f"over {args.rounds} rounds; failed calls: {failed}"
        )


if __name__ == "__main__":
    main()
