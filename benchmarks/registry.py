"""Registry throughput and load cost, side by side with their floors (issue 3, item 9).

Run from the repository root (all figures come from one run; each is the median of several
rounds)::

    PYTHONPATH=src python benchmarks/registry.py [--rounds 5] [--processes 150]
        [--renewals 100000] [--postgres URL]

(a) One process's register → started → completed, per second:
    - ``registry``: ``ProcessRegistry`` (``authority=workflow_key``, no lease);
    - ``raw es``: a minimal eventsourcing aggregate doing the same work on the same store kind
      (create+save; get+trigger+save twice);
    - ``raw sql``: plain sqlite3 (or psycopg) transactions doing the same inserts and reads
      (read the record, insert the event + upsert the record + advance tracking; twice read
      the events, insert one, upsert the record, advance tracking), at the same durability
      (WAL, synchronous=FULL on SQLite files).
    on a SQLite file and memory (and PostgreSQL with ``--postgres`` or
    ``$PROCLEDGER_TEST_POSTGRES_URL``).
(b) Loading a process (``get``, and replaying its aggregate with
    ``registry._ledger.load_process``) after ``--renewals`` lease renewals, against a fresh
    process with the same events.

Targets: registry ≥ 70% of raw es and ≥ 40% of raw sql on SQLite; (b) within 2×.
"""

from __future__ import annotations

import argparse
import functools
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event

from _common import conninfo, eventsourcing_postgres_env, postgres_schemas, with_schema
from procledger import (
    CompletionAuthority,
    LeaseOwner,
    Originator,
    ProcessInput,
    ProcessRegistration,
    RecoveryDisposition,
    open_registry,
)
from procledger.domain.registration import env_ref_for

AUTHORITY = CompletionAuthority.workflow_key("bench")
ENV_REF = env_ref_for({"PATH": "/usr/bin"})


def registration(process_id: str) -> ProcessRegistration:
    return ProcessRegistration(
        id=process_id,
        input=ProcessInput.command(["/usr/bin/make", "-C", "/src/project", "test"]),
        disposition=RecoveryDisposition.owner_bound,
        originator=Originator.host(),
        env_ref=ENV_REF,
        definition={"workflow": "ci", "step": "test"},
    )


def registrations(prefix: str, count: int) -> list[ProcessRegistration]:
    return [registration(f"{prefix}-{index}") for index in range(count)]


# -- (a) the three implementations ------------------------------------------------------------


class Job(Aggregate):
    """The minimal raw eventsourcing aggregate: the same three facts, nothing else."""

    @event("Registered")
    def __init__(self, registration: dict[str, Any], at_ms: int) -> None:
        self.registration = registration
        self.state = "starting"

    @event("Started")
    def start(self, started_at_ms: int) -> None:
        self.state = "running"
        self.started_at_ms = started_at_ms

    @event("Completed")
    def complete(self, exit_code: int) -> None:
        self.state = "exited"
        self.exit_code = exit_code


class Runner:
    """One implementation on one store: ``run(registrations)`` does their processes' work.

    Every implementation is handed the same registrations, built before the clock starts:
    constructing the caller's input models is the caller's cost, not the store's.
    """

    name = ""

    def run(self, registrations: list[ProcessRegistration]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class RegistryRunner(Runner):
    name = "registry"

    def __init__(self, url: str) -> None:
        self.registry = open_registry(url)

    def run(self, registrations: list[ProcessRegistration]) -> None:
        registry = self.registry
        for item in registrations:
            pid = item.id
            registry.register(item)
            registry.record_started(pid, 1)
            registry.record_completed(pid, "exited", "exited", exit_code=0, authority=AUTHORITY)

    def close(self) -> None:
        self.registry.close()


class RawEventsourcingRunner(Runner):
    name = "raw es"

    def __init__(self, env: dict[str, str]) -> None:
        self.app: Application[Any] = Application(env=env)

    def run(self, registrations: list[ProcessRegistration]) -> None:
        app = self.app
        for item in registrations:
            job = Job(item.model_dump(mode="json"), at_ms=1)
            app.save(job)
            job = app.repository.get(job.id)
            job.start(1)
            app.save(job)
            job = app.repository.get(job.id)
            job.complete(0)
            app.save(job)

    def close(self) -> None:
        self.app.close()


_RAW_RECORD = orjson.dumps(
    {"registration": registration("x" * 16).model_dump(mode="json"), "state": "running"}
)


class RawSqliteRunner(Runner):
    """The floor: the same inserts and reads as hand-written sqlite3 transactions."""

    name = "raw sql"

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        if path != ":memory:":
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(
            """
            CREATE TABLE events (notification_id INTEGER PRIMARY KEY AUTOINCREMENT,
                originator_id TEXT, originator_version INTEGER, topic TEXT, state BLOB);
            CREATE UNIQUE INDEX events_key ON events (originator_id, originator_version);
            CREATE TABLE records (process_id TEXT PRIMARY KEY, change_seq INTEGER, record TEXT);
            CREATE TABLE tracking (name TEXT PRIMARY KEY, position INTEGER);
            INSERT INTO tracking VALUES ('records', 0);
            """
        )

    def _append(self, pid: str, version: int, topic: str) -> None:
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        cursor = db.execute(
            "INSERT INTO events (originator_id, originator_version, topic, state) VALUES (?,?,?,?)",
            (pid, version, topic, _RAW_RECORD),
        )
        db.execute(
            "INSERT INTO records VALUES (?,?,?) ON CONFLICT (process_id) DO UPDATE SET "
            "change_seq=excluded.change_seq, record=excluded.record",
            (pid, cursor.lastrowid, _RAW_RECORD.decode()),
        )
        db.execute(
            "UPDATE tracking SET position=? WHERE name='records' AND position<?",
            (cursor.lastrowid, cursor.lastrowid),
        )
        db.execute("COMMIT")

    def _read_events(self, pid: str) -> int:
        rows = self.db.execute(
            "SELECT originator_version, state FROM events WHERE originator_id=? "
            "ORDER BY originator_version",
            (pid,),
        ).fetchall()
        return len(rows)

    def run(self, registrations: list[ProcessRegistration]) -> None:
        for item in registrations:
            pid = item.id
            self.db.execute("SELECT record FROM records WHERE process_id=?", (pid,)).fetchone()
            self._append(pid, 1, "Registered")
            self._append(pid, self._read_events(pid) + 1, "Started")
            self._append(pid, self._read_events(pid) + 1, "Completed")

    def close(self) -> None:
        self.db.close()


class RawPostgresRunner(Runner):
    """The PostgreSQL floor: the same statements through one psycopg connection."""

    name = "raw sql"

    def __init__(self, url: str, schema: str) -> None:
        import psycopg

        self.db = psycopg.connect(conninfo(url))
        with self.db.transaction():
            self.db.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            self.db.execute(f'SET search_path TO "{schema}"')
            self.db.execute(
                """CREATE TABLE raw_events (notification_id BIGSERIAL PRIMARY KEY,
                originator_id TEXT, originator_version INTEGER, topic TEXT, state BYTEA,
                UNIQUE (originator_id, originator_version))"""
            )
            self.db.execute(
                "CREATE TABLE raw_records (process_id TEXT PRIMARY KEY, change_seq BIGINT, "
                "record TEXT)"
            )
            self.db.execute("CREATE TABLE raw_tracking (name TEXT PRIMARY KEY, position BIGINT)")
            self.db.execute("INSERT INTO raw_tracking VALUES ('records', 0)")
        self.db.commit()

    def _append(self, pid: str, version: int, topic: str) -> None:
        db = self.db
        with db.transaction():
            db.execute("LOCK TABLE raw_events IN EXCLUSIVE MODE")
            row = db.execute(
                "INSERT INTO raw_events (originator_id, originator_version, topic, state) "
                "VALUES (%s,%s,%s,%s) RETURNING notification_id",
                (pid, version, topic, _RAW_RECORD),
            ).fetchone()
            assert row is not None
            db.execute(
                "INSERT INTO raw_records VALUES (%s,%s,%s) ON CONFLICT (process_id) DO UPDATE "
                "SET change_seq=excluded.change_seq, record=excluded.record",
                (pid, row[0], _RAW_RECORD.decode()),
            )
            db.execute(
                "UPDATE raw_tracking SET position=%s WHERE name='records' AND position<%s",
                (row[0], row[0]),
            )

    def _read_events(self, pid: str) -> int:
        with self.db.transaction():
            rows = self.db.execute(
                "SELECT originator_version, state FROM raw_events WHERE originator_id=%s "
                "ORDER BY originator_version",
                (pid,),
            ).fetchall()
        return len(rows)

    def run(self, registrations: list[ProcessRegistration]) -> None:
        for item in registrations:
            pid = item.id
            with self.db.transaction():
                self.db.execute("SELECT record FROM raw_records WHERE process_id=%s", (pid,))
            self._append(pid, 1, "Registered")
            self._append(pid, self._read_events(pid) + 1, "Started")
            self._append(pid, self._read_events(pid) + 1, "Completed")

    def close(self) -> None:
        self.db.close()


# -- stores ---------------------------------------------------------------------------------------


def runners(store: str, folder: Path, postgres: Callable[[], str] | None, url: str) -> list[Runner]:
    tag = uuid.uuid4().hex[:8]
    if store == "sqlite":
        return [
            RegistryRunner(f"sqlite:///{folder}/registry-{tag}.db"),
            RawEventsourcingRunner(
                {
                    "PERSISTENCE_MODULE": "eventsourcing.sqlite",
                    "SQLITE_DBNAME": f"{folder}/es-{tag}.db",
                }
            ),
            RawSqliteRunner(f"{folder}/raw-{tag}.db"),
        ]
    if store == "memory":
        return [
            RegistryRunner("memory://"),
            RawEventsourcingRunner(
                {
                    "PERSISTENCE_MODULE": "eventsourcing.sqlite",
                    "SQLITE_DBNAME": f"file:es-{tag}?mode=memory&cache=shared",
                }
            ),
            RawSqliteRunner(":memory:"),
        ]
    assert postgres is not None
    schema = postgres()
    return [
        RegistryRunner(with_schema(url, schema)),
        RawEventsourcingRunner(eventsourcing_postgres_env(url, postgres())),
        RawPostgresRunner(url, postgres()),
    ]


# -- measuring -------------------------------------------------------------------------------------


def measure_throughput(
    store: str,
    folder: Path,
    *,
    count: int,
    rounds: int,
    postgres: Callable[[], str] | None,
    url: str,
) -> tuple[dict[str, float], dict[str, float]]:
    """Median processes per second of each implementation, and the median over rounds of the
    registry's rate over each baseline's in the same round (the load on a shared machine
    drifts between rounds far more than within one). Rounds interleave the implementations
    and rotate their order."""
    implementations = runners(store, folder, postgres, url)
    samples: dict[str, list[float]] = {r.name: [] for r in implementations}
    try:
        for runner in implementations:
            runner.run(registrations("warmup", 5))
        for round_index in range(rounds):
            shift = round_index % len(implementations)
            for runner in implementations[shift:] + implementations[:shift]:
                batch = registrations(f"r{round_index}", count)
                started = time.perf_counter()
                runner.run(batch)
                samples[runner.name].append(count / (time.perf_counter() - started))
    finally:
        for runner in implementations:
            runner.close()
    rates = {name: statistics.median(values) for name, values in samples.items()}
    ratios = {
        name: statistics.median(
            ours / theirs for ours, theirs in zip(samples["registry"], values, strict=True)
        )
        for name, values in samples.items()
    }
    return rates, ratios


def time_per_call(call: Callable[[], object], repeat: int, rounds: int) -> float:
    """Median over rounds of the mean seconds per call."""
    results = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(repeat):
            call()
        results.append((time.perf_counter() - started) / repeat)
    return statistics.median(results)


def measure_load_after_renewals(url: str, renewals: int, rounds: int) -> dict[str, float]:
    registry = open_registry(url)
    try:
        for pid in ("fresh", "renewed"):
            registry.register(registration(pid))
            registry.record_started(pid, 1)
        owner = LeaseOwner(owner_id="bench", incarnation_id="one")
        acquired = registry.claim_lease("renewed", owner, 3_600_000)
        lease = acquired.lease  # type: ignore[union-attr]
        started = time.perf_counter()
        for _ in range(renewals):
            lease = registry.renew_lease(lease, 3_600_000)
        renew_rate = renewals / (time.perf_counter() - started)
        assert len(registry.events("renewed")) == len(registry.events("fresh")) == 2
        figures = {"renewals/s": renew_rate}
        samples: dict[str, list[float]] = {}
        for _ in range(rounds):  # interleaved, so drifting machine load hits both alike
            for pid in ("fresh", "renewed"):
                calls: dict[str, Callable[[str], object]] = {
                    "get": registry.get,
                    "load": registry._ledger.load_process,
                }
                for what, call in calls.items():
                    samples.setdefault(f"{what} {pid}", []).append(
                        time_per_call(functools.partial(call, pid), 300, 1)
                    )
        figures.update({key: statistics.median(values) for key, values in samples.items()})
        return figures
    finally:
        registry.close()


# -- reporting -------------------------------------------------------------------------------------


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]
    line = " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    print(line)
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(str(c).rjust(w) for c, w in zip(row, widths, strict=True)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--processes", type=int, default=150, help="processes per round")
    parser.add_argument("--renewals", type=int, default=100_000)
    parser.add_argument(
        "--renewal-store",
        default="memory",
        choices=["memory", "sqlite", "postgres"],
        help="where to renew (a SQLite file at synchronous=FULL renews at the fsync rate)",
    )
    parser.add_argument("--postgres", default=os.environ.get("PROCLEDGER_TEST_POSTGRES_URL"))
    parser.add_argument("--stores", default="sqlite,memory,postgresql", help="for (a)")
    args = parser.parse_args(argv)

    stores = [
        store
        for store in args.stores.split(",")
        if store in ("sqlite", "memory") or (store == "postgresql" and args.postgres)
    ]
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}")
    print(
        f"(a) register→started→completed, processes/s, median of {args.rounds} rounds; "
        "ratios are medians of the per-round ratios"
    )
    rows = []
    failures = []
    with tempfile.TemporaryDirectory() as tmp, postgres_schemas(args.postgres or "") as schemas:
        folder = Path(tmp)
        pg = schemas if args.postgres else None
        for store in stores:
            figures, ratios = measure_throughput(
                store,
                folder,
                count=args.processes,
                rounds=args.rounds,
                postgres=pg,
                url=args.postgres or "",
            )
            of_es, of_raw = ratios["raw es"], ratios["raw sql"]
            rows.append(
                [
                    store,
                    f"{figures['registry']:,.0f}",
                    f"{figures['raw es']:,.0f}",
                    f"{figures['raw sql']:,.0f}",
                    f"{of_es:.0%}",
                    f"{of_raw:.0%}",
                ]
            )
            if store == "sqlite":
                if of_es < 0.7:
                    failures.append(f"registry is {of_es:.0%} of raw es on SQLite (< 70%)")
                if of_raw < 0.4:
                    failures.append(f"registry is {of_raw:.0%} of raw sql on SQLite (< 40%)")
        print_table(["store", "registry", "raw es", "raw sql", "reg/es", "reg/sql"], rows)
        print()
        if args.renewal_store == "sqlite":
            renewal_url = f"sqlite:///{folder}/renewals.db"
        elif args.renewal_store == "postgres":
            if not args.postgres:
                parser.error("--renewal-store postgres needs --postgres URL")
            renewal_url = with_schema(args.postgres, schemas())
        else:
            renewal_url = "memory://"
        print(f"(b) loading a process after {args.renewals:,} renewals ({args.renewal_store})")
        load = measure_load_after_renewals(renewal_url, args.renewals, 3 * args.rounds)
        print(f"renewals: {load['renewals/s']:,.0f}/s")
        rows = []
        for what in ("get", "load"):
            fresh, renewed = load[f"{what} fresh"], load[f"{what} renewed"]
            rows.append(
                [
                    "get (read model)" if what == "get" else "load_process (replay)",
                    f"{fresh * 1e6:,.1f}",
                    f"{renewed * 1e6:,.1f}",
                    f"{renewed / fresh:.2f}×",
                ]
            )
            if renewed > 2 * fresh:
                failures.append(f"{what} after renewals is {renewed / fresh:.1f}× a fresh one")
        print_table(["operation", "fresh µs", "renewed µs", "ratio"], rows)
    print()
    for failure in failures:
        print(f"MISSED: {failure}")
    if not failures:
        print("all targets met")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
