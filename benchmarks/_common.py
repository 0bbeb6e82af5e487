"""What the benchmark scripts share: timing and medians, and throwaway stores -- a SQLite file
in a temporary folder, fresh PostgreSQL schemas dropped afterwards, and the environment that
points a raw eventsourcing application at such a schema.

The scripts run as ``PYTHONPATH=src python benchmarks/NAME.py``, so this folder is first on
``sys.path`` and they import this module as ``_common``.
"""

from __future__ import annotations

import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

# -- timing ----------------------------------------------------------------------------------------


def timed(fn: Callable[[], object]) -> float:
    """Wall-clock seconds one call of ``fn`` takes."""
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def median_ms(samples: Iterable[float]) -> float:
    """The median of samples in seconds, in milliseconds."""
    return statistics.median(samples) * 1e3


def interleaved(
    ours: Callable[[], object], theirs: Callable[[], object], calls: int
) -> tuple[float, float]:
    """Medians (ms) of ``calls`` alternating calls, so a busy machine's drift hits both alike."""
    pairs = [(timed(ours), timed(theirs)) for _ in range(calls)]
    return median_ms(p[0] for p in pairs), median_ms(p[1] for p in pairs)


# -- stores ----------------------------------------------------------------------------------------


@contextmanager
def sqlite_ledger(name: str = "ledger.db") -> Iterator[str]:
    """A ``sqlite:///`` URL in a fresh temporary folder, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="procledger-bench-") as folder:
        yield f"sqlite:///{Path(folder) / name}"


def conninfo(url: str) -> str:
    """A PostgreSQL URL as libpq understands it: without procledger's ``schema`` parameter."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "schema"]
    return urlunsplit(parts._replace(query=urlencode(query)))


def with_schema(url: str, schema: str) -> str:
    """``url`` naming ``schema`` (any other ``schema`` parameter replaced)."""
    parts = urlsplit(conninfo(url))
    query = [*parse_qsl(parts.query), ("schema", schema)]
    return urlunsplit(parts._replace(query=urlencode(query)))


def new_schema_name() -> str:
    return f"bench_{uuid.uuid4().hex[:12]}"


def create_schema(url: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(conninfo(url), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))


def drop_schemas(url: str, schemas: Iterable[str]) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(conninfo(url), autocommit=True) as conn:
        for schema in schemas:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@contextmanager
def postgres_ledger(url: str) -> Iterator[str]:
    """``url`` with a fresh schema (the store creates it), dropped afterwards."""
    schema = new_schema_name()
    try:
        yield with_schema(url, schema)
    finally:
        drop_schemas(url, [schema])


@contextmanager
def postgres_schemas(url: str) -> Iterator[Callable[[], str]]:
    """A factory of fresh, created schemas for one run; all dropped at the end."""
    made: list[str] = []

    def make() -> str:
        made.append(new_schema_name())
        create_schema(url, made[-1])
        return made[-1]

    try:
        yield make
    finally:
        if made:
            drop_schemas(url, made)


def eventsourcing_postgres_env(url: str, schema: str) -> dict[str, str]:
    """The environment of a plain eventsourcing ``Application`` on ``schema`` of ``url``."""
    parts = urlsplit(url)
    return {
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_DBNAME": parts.path.lstrip("/"),
        "POSTGRES_HOST": parts.hostname or "localhost",
        "POSTGRES_PORT": str(parts.port or 5432),
        "POSTGRES_USER": parts.username or "postgres",
        "POSTGRES_PASSWORD": parts.password or "",
        "POSTGRES_SCHEMA": schema,
    }
