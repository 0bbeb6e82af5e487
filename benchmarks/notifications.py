"""Completion notifications through validate → journal → dispatch, beside a raw eventsourcing
append of the same payload, in the same run, on the same kind of store.

    PYTHONPATH=src python benchmarks/notifications.py [--count 400] [--rounds 5] [--postgres]

For each store (in-memory SQLite, a SQLite file, and PostgreSQL with ``--postgres`` and
``$PROCLEDGER_TEST_POSTGRES_URL``) every round measures, interleaved so drift hits all alike:

* raw: a minimal eventsourcing ``Application`` saving one aggregate event per notification
  (the six fields of the notification) — the cost of one durable append;
* first: ``model_validate_json`` of the notification, then ``notify_process_completion``
  (validate again, journal, dispatch into the loop's inbox) — ACCEPTED;
* retry: the identical notifications again — DUPLICATE, nothing written.

Rates are medians over the rounds. Targets (issue 5): first ≥ 60% of raw on SQLite; a retry
costs no more than a first delivery.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from eventsourcing.application import Application
from eventsourcing.domain import Aggregate

from _common import (
    create_schema,
    drop_schemas,
    eventsourcing_postgres_env,
    new_schema_name,
    with_schema,
)
from procledger import ProcessRegistry, open_registry
from procledger.notifications import LoopInbox, NotificationDisposition, Notifier

N = NotificationDisposition


class Notice(Aggregate):
    """The raw baseline: one aggregate per notification, created with its six fields."""

    def __init__(
        self,
        *,
        command_id: str,
        session_id: str,
        loop_id: str,
        process_handle: str,
        state: str,
        reason: str,
    ) -> None:
        self.command_id = command_id
        self.session_id = session_id
        self.loop_id = loop_id
        self.process_handle = process_handle
        self.state = state
        self.reason = reason


class RawApp(Application[uuid.UUID]):
    name = "rawbench"


def payloads(count: int, session: uuid.UUID, loop: uuid.UUID) -> list[bytes]:
    return [
        orjson.dumps(
            {
                "command_id": str(uuid.uuid4()),
                "session_id": str(session),
                "loop_id": str(loop),
                "process_handle": uuid.uuid4().hex[:22],
                "state": "exited",
                "reason": "exited",
            }
        )
        for _ in range(count)
    ]


@dataclass
class Store:
    """One kind of store: where the ledger goes and where the raw baseline goes."""

    name: str
    ledger_url: str
    raw_env: dict[str, str]
    cleanup: list[Callable[[], None]] = field(default_factory=list)


@dataclass
class Rates:
    raw: list[float] = field(default_factory=list)
    first: list[float] = field(default_factory=list)
    retry: list[float] = field(default_factory=list)


def timed(run: Callable[..., None], target: Any, batch: list[bytes], *args: Any) -> float:
    """Operations per second of ``run(target, batch, *args)``."""
    start = time.perf_counter()
    run(target, batch, *args)
    return len(batch) / (time.perf_counter() - start)


def raw_round(app: RawApp, batch: list[bytes]) -> None:
    for raw in batch:
        app.save(Notice(**orjson.loads(raw)))


def notify_round(notifier: Notifier, batch: list[bytes], expected: N) -> None:
    from procledger.domain.notification import ProcessCompletionNotification

    for raw in batch:
        delivery = notifier.notify_process_completion(
            ProcessCompletionNotification.model_validate_json(raw)
        )
        if delivery.disposition is not expected:
            raise AssertionError(f"expected {expected}, got {delivery}")


def measure(store: Store, count: int, rounds: int) -> Rates:
    registry: ProcessRegistry = open_registry(store.ledger_url)
    app = RawApp(env=store.raw_env)
    rates = Rates()
    try:
        session = uuid.uuid4()
        notifier = Notifier(registry, session)
        warm_loop = uuid.uuid4()
        notifier.add_loop(warm_loop, LoopInbox(count))
        warm = payloads(min(count, 50), session, warm_loop)
        raw_round(app, warm)
        notify_round(notifier, warm, N.ACCEPTED)
        for _ in range(rounds):
            loop = uuid.uuid4()
            notifier.add_loop(loop, LoopInbox(count))
            batch = payloads(count, session, loop)
            rates.raw.append(timed(raw_round, app, batch))
            rates.first.append(timed(notify_round, notifier, batch, N.ACCEPTED))
            rates.retry.append(timed(notify_round, notifier, batch, N.DUPLICATE))
    finally:
        app.close()
        registry.close()
    return rates


@contextmanager
def stores(postgres: bool) -> Iterator[list[Store]]:
    folder = tempfile.TemporaryDirectory(prefix="procledger-bench-")
    made: list[Store] = [
        Store(
            "memory",
            "memory://",
            {
                "PERSISTENCE_MODULE": "eventsourcing.sqlite",
                "SQLITE_DBNAME": f"file:raw-{uuid.uuid4().hex}?mode=memory&cache=shared",
            },
        ),
        Store(
            "sqlite",
            f"sqlite:///{folder.name}/ledger.db",
            {
                "PERSISTENCE_MODULE": "eventsourcing.sqlite",
                "SQLITE_DBNAME": f"{folder.name}/raw.db",
            },
        ),
    ]
    if postgres:
        made.append(_postgres_store())
    try:
        yield made
    finally:
        for store in made:
            for clean in store.cleanup:
                clean()
        folder.cleanup()


def _postgres_store() -> Store:
    base = os.environ.get("PROCLEDGER_TEST_POSTGRES_URL", "").strip()
    if not base:
        sys.exit("--postgres needs $PROCLEDGER_TEST_POSTGRES_URL")
    ledger_schema, raw_schema = new_schema_name(), new_schema_name()
    create_schema(base, raw_schema)
    return Store(
        "postgresql",
        with_schema(base, ledger_schema),
        eventsourcing_postgres_env(base, raw_schema),
        [lambda: drop_schemas(base, [ledger_schema, raw_schema])],
    )


def report(name: str, rates: Rates) -> dict[str, Any]:
    raw = statistics.median(rates.raw)
    first = statistics.median(rates.first)
    retry = statistics.median(rates.retry)
    row = {
        "store": name,
        "raw_append_per_s": round(raw),
        "notify_per_s": round(first),
        "retry_per_s": round(retry),
        "notify_vs_raw": round(first / raw, 3),
        "retry_cost_vs_first": round(first / retry, 3),  # time per retry / time per first
    }
    print(
        f"{name:<11} raw append {raw:9.0f}/s   notify {first:9.0f}/s   "
        f"retry {retry:9.0f}/s   notify/raw {first / raw:6.2f}   "
        f"retry cost/first {first / retry:5.2f}"
    )
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=400, help="notifications per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--postgres", action="store_true", help="also PostgreSQL")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    print(f"{args.count} notifications per round, median of {args.rounds} rounds")
    rows = []
    with stores(args.postgres) as kinds:
        for store in kinds:
            rows.append(report(store.name, measure(store, args.count, args.rounds)))
    sqlite = next(row for row in rows if row["store"] == "sqlite")
    checks = {
        "sqlite notify >= 60% of raw append": sqlite["notify_vs_raw"] >= 0.6,
        "retry costs no more than a first delivery": all(
            row["retry_cost_vs_first"] <= 1.0 for row in rows
        ),
    }
    for check, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {check}")
    if args.json:
        args.json.write_text(orjson.dumps({"rows": rows, "checks": checks}).decode())
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
