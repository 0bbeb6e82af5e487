"""Reads of the events table beyond eventsourcing's: one aggregate's log with positions, the
whole log streamed for a rebuild, and the deletions retention makes."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import orjson

from procledger.adapters.sql.salvage import describe_unreadable, readable_rows
from procledger.adapters.sql.store import Tx

if TYPE_CHECKING:
    from uuid import UUID

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


def streams_missing(tx: Tx, keys: Sequence[str]) -> set[str]:
    """Which of these stream keys (a UUID's 32 hex digits) have no events, in one statement
    per ``_KEYS_PER_QUERY`` keys, each an index probe on the log's key. A rebuild asks this of
    every record and almost every answer is "has events", so the query returns the
    exceptions only."""
    missing: set[str] = set()
    for start in range(0, len(keys), _KEYS_PER_QUERY):
        chunk = list(keys[start : start + _KEYS_PER_QUERY])
        rows = tx.execute(_missing_statement(tx), (_key_list(tx, chunk),)).all()
        missing.update(str(row["k"]) for row in rows)
    return missing


_KEYS_PER_QUERY = 2_000


def _missing_statement(tx: Tx) -> str:
    """The keys (one parameter: a list) with no row in the log. SQLite stores the key as that
    text and walks a JSON array; PostgreSQL stores a ``uuid`` and unnests an array."""
    events = tx.dialect.events_table
    if tx.dialect.name == "postgresql":
        return (
            "SELECT k FROM unnest(?::text[]) AS keys(k) WHERE NOT EXISTS "
            f"(SELECT 1 FROM {events} WHERE originator_id = k::uuid)"
        )
    return (
        "SELECT value AS k FROM json_each(?) WHERE NOT EXISTS "
        f"(SELECT 1 FROM {events} WHERE originator_id = value)"
    )


def _key_list(tx: Tx, keys: list[str]) -> Any:
    """The keys as the one parameter ``_missing_statement`` takes."""
    return keys if tx.dialect.name == "postgresql" else orjson.dumps(keys).decode()


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
    """``(notification_id, key, version, topic, state)`` tuples (``_log_columns``: the key as
    text, key and topic raw where a file may hold any bytes), one aggregate after another,
    fetched lazily (a server-side cursor on PostgreSQL), so memory stays flat."""
    dialect = tx.dialect
    query = (
        f"SELECT {_log_columns(tx)} "
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


def readable_log(tx: Tx, unreadable: list[str]) -> list[Row]:
    """What can be read of the log of a damaged SQLite file (``salvage``), as ``stream_log``
    gives it -- in ``(stream, version)`` order, sorted here, so held in memory -- the rows
    that could not be read said in ``unreadable``."""
    salvaged = readable_rows(tx, tx.dialect.events_table, _log_columns(tx))
    unreadable.extend(describe_unreadable(tx.dialect.events_table, salvaged.unreadable))
    rows = [tuple(row)[2:] for row in salvaged.rows]
    rows.sort(key=_log_order)
    return rows


def _log_order(row: Row) -> tuple[bytes, int]:
    """A salvaged event's place in the log (a damaged row's key or version sorts first)."""
    key, version = row[1], row[2]
    stored = bytes(key) if isinstance(key, bytes | memoryview) else str(key).encode()
    return stored, version if isinstance(version, int) else -1


def _log_columns(tx: Tx) -> str:
    """The columns of a rebuild's rows; keys as text (``Dialect.key_text``), and keys and
    topics as raw bytes where a file may hold invalid UTF-8, so one damaged row spoils its own
    stream only (``Dialect.raw_text``). The key gets a name of its own: named ``originator_id``
    it would be what ``ORDER BY originator_id`` sorts, as text, past the log's index."""
    dialect = tx.dialect
    return (
        f"{dialect.notification_id}, {dialect.key_text('originator_id')} AS stream_key, "
        "originator_version, "
        f"{dialect.raw_text('topic')}, state"
    )


def log_batch(tx: Tx, after: Any, limit: int) -> list[Row]:
    """Up to ``limit`` events of the streams after stream ``after`` (``None``: from the first),
    as ``(notification_id, key, version, topic, state)`` tuples (``_log_columns``: the key as
    text) in ``(stream, version)`` order; ``stream_rest`` completes the last stream. Keys
    compare as stored (hex text on SQLite, ``uuid`` on PostgreSQL)."""
    where = "" if after is None else f"WHERE originator_id>{tx.dialect.key_param()} "
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
        f"WHERE originator_id={tx.dialect.key_param()} AND originator_version>? "
        "ORDER BY originator_version",
        (originator_id, after_version),
    )


def max_position(tx: Tx) -> int:
    """The highest notification id in the log (0 when empty)."""
    row = tx.execute(
        f"SELECT MAX({tx.dialect.notification_id}) AS n FROM {tx.dialect.events_table}"
    ).one()
    return int(row["n"] or 0)
