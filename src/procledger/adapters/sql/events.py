"""Reads of the events table beyond eventsourcing's: one aggregate's log with positions, the
whole log streamed for a rebuild, and the deletions retention makes."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from procledger.adapters.sql.store import Tx

Row = tuple[Any, ...]
STREAM_BATCH = 2_000


def aggregate_rows(tx: Tx, key: UUID, after: int = 0) -> list[Any]:
    """One aggregate's events after version ``after``, in order: ``position`` (notification
    id), ``originator_version``, ``topic``, ``state``."""
    dialect = tx.dialect
    return tx.execute(
        f"SELECT {dialect.notification_id} AS position, originator_version, topic, state "
        f"FROM {dialect.events_table} WHERE originator_id=? AND originator_version>? "
        "ORDER BY originator_version",
        (dialect.originator_key(key), after),
    ).all()


def max_version(tx: Tx, key: UUID) -> int:
    """The highest version in one aggregate's log (0 when it has none)."""
    row = tx.execute(
        f"SELECT MAX(originator_version) AS v FROM {tx.dialect.events_table} WHERE originator_id=?",
        (tx.dialect.originator_key(key),),
    ).one()
    return int(row["v"] or 0)


def streams_present(tx: Tx, keys: Sequence[UUID]) -> set[UUID]:
    """Which of these aggregates still have events (one query per 500 keys, on the log's
    ``(originator_id, originator_version)`` key)."""
    found: set[UUID] = set()
    for start in range(0, len(keys), 500):
        stored = {tx.dialect.originator_key(key): key for key in keys[start : start + 500]}
        chunk = list(stored)
        if tx.dialect.name == "postgresql":  # one array parameter: a 500-value IN list
            where, params = "= ANY(?)", [chunk]  # took the server ~90 ms to plan each time
        else:
            where, params = f"IN ({','.join('?' * len(chunk))})", chunk
        rows = tx.execute(
            f"SELECT DISTINCT originator_id FROM {tx.dialect.events_table} "
            f"WHERE originator_id {where}",
            params,
        ).all()
        for row in rows:  # a value comes back as it was asked for: no UUID to parse
            value = row["originator_id"]
            found.add(stored.get(value) or (value if isinstance(value, UUID) else UUID(value)))
    return found


def delete_aggregate(tx: Tx, key: UUID) -> int:
    """Delete one aggregate's whole log; returns how many events went."""
    tx.execute(
        f"DELETE FROM {tx.dialect.events_table} WHERE originator_id=?",
        (tx.dialect.originator_key(key),),
    )
    return tx.rowcount


def count_events(tx: Tx) -> int:
    return int(tx.execute(f"SELECT COUNT(*) AS n FROM {tx.dialect.events_table}").one()["n"])


@contextmanager
def stream_log(tx: Tx) -> Iterator[Iterator[Row]]:
    """``(notification_id, originator_id, version, topic, state)`` tuples, one aggregate after
    another, fetched lazily (a server-side cursor on PostgreSQL), so memory stays flat."""
    dialect = tx.dialect
    query = (
        f"SELECT {dialect.notification_id}, originator_id, originator_version, topic, state "
        f"FROM {dialect.events_table} ORDER BY originator_id, originator_version"
    )
    connection = tx.cursor.connection
    if dialect.name == "postgresql":
        from psycopg.rows import tuple_row  # psycopg only for PostgreSQL stores

        with connection.cursor(name="procledger_rebuild", row_factory=tuple_row) as cursor:
            cursor.itersize = STREAM_BATCH
            cursor.execute(query)
            yield iter(cursor)
        return
    cursor = connection.cursor()
    cursor.row_factory = None
    try:
        cursor.execute(query)
        yield iter(cursor)
    finally:
        cursor.close()


def _log_columns(tx: Tx) -> str:
    """The columns of a rebuild's rows; ids and topics as raw bytes where a file may hold
    invalid UTF-8, so one damaged row spoils its own stream only (``Dialect.raw_text``)."""
    dialect = tx.dialect
    return (
        f"{dialect.notification_id}, {dialect.raw_text('originator_id')}, originator_version, "
        f"{dialect.raw_text('topic')}, state"
    )


def log_batch(tx: Tx, after: Any, limit: int) -> list[Row]:
    """Up to ``limit`` events of the streams after stream ``after`` (``None``: from the first),
    as ``stream_log`` tuples, in ``(stream, version)`` order; ``stream_rest`` completes the
    last stream. Stream ids compare as stored (hex text on SQLite, ``uuid`` on PostgreSQL)."""
    where = "" if after is None else f"WHERE originator_id>{tx.dialect.raw_param()} "
    return _tuples(
        tx,
        f"SELECT {_log_columns(tx)} FROM {tx.dialect.events_table} {where}"
        "ORDER BY originator_id, originator_version LIMIT ?",
        (limit,) if after is None else (after, limit),
    )


def _tuples(tx: Tx, statement: str, params: Sequence[Any]) -> list[Row]:
    """The statement's rows as plain tuples, straight from the driver: building a dict (or a
    ``sqlite3.Row``) per event only to turn it into a tuple costs a rebuild several per cent."""
    connection = tx.cursor.connection
    if tx.dialect.name == "postgresql":
        from psycopg.rows import tuple_row  # psycopg only for PostgreSQL stores

        cursor = connection.cursor(row_factory=tuple_row)
    else:
        cursor = connection.cursor()
        cursor.row_factory = None
    try:
        cursor.execute(tx.dialect.statement(statement), params)
        return list(cursor.fetchall())
    finally:
        cursor.close()


def stream_rest(tx: Tx, originator_id: Any, after_version: int) -> list[Row]:
    """The events of one stream after ``after_version`` (the end of a batch), in order."""
    return _tuples(
        tx,
        f"SELECT {_log_columns(tx)} FROM {tx.dialect.events_table} "
        f"WHERE originator_id={tx.dialect.raw_param()} AND originator_version>? "
        "ORDER BY originator_version",
        (originator_id, after_version),
    )


def max_position(tx: Tx) -> int:
    """The highest notification id in the log (0 when empty)."""
    row = tx.execute(
        f"SELECT MAX({tx.dialect.notification_id}) AS n FROM {tx.dialect.events_table}"
    ).one()
    return int(row["n"] or 0)
