"""The ``records`` read model table (one row per process at its latest state) and the
``tracking`` row that says which log position it reflects.

Besides the whole record (JSON), a row keeps the columns that filters and the change feed
query, so listing never decodes records it does not return.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import orjson

from procledger.adapters.sql.damage import damage_marker
from procledger.adapters.sql.salvage import describe_unreadable, readable_rows
from procledger.adapters.sql.store import Tx
from procledger.domain.errors import NotFound
from procledger.domain.vocabulary import ProcessState

RECORD_COLUMNS = (
    "process_id, change_seq, status, terminal, waiting, originator_scope_id, identity_kind, "
    "identity_label, definition, created_at_ms, updated_at_ms, record"
)
_COLUMNS = frozenset(column.strip() for column in RECORD_COLUMNS.split(","))
_TERMINAL_STATES = frozenset(state.value for state in ProcessState if state.is_terminal)
_UPDATED_COLUMNS = [column.strip() for column in RECORD_COLUMNS.split(",")][1:]
# What a write after the registration can change; the rest comes from the registration alone.
_CHANGING_COLUMNS = ("change_seq", "status", "terminal", "waiting", "updated_at_ms", "record")
_UPDATE = (
    "UPDATE {table} SET "
    + ", ".join(f"{column}=?" for column in _CHANGING_COLUMNS)
    + " WHERE process_id=?"
)
# Assigning an indexed column rewrites its index entries, even to the same value: one more
# page in the commit per index. A write that leaves the process going changes neither
# ``terminal`` (0: terminal states are final) nor ``status`` (every going state is
# ``running``), so it assigns neither; its ``WHERE`` makes sure the row already says so, and a
# row that does not (missing, or damaged) takes the full update.
_GOING_COLUMNS = tuple(c for c in _CHANGING_COLUMNS if c not in ("terminal", "status"))
_UPDATE_GOING = (
    "UPDATE {table} SET "
    + ", ".join(f"{column}=?" for column in _GOING_COLUMNS)
    + " WHERE process_id=? AND terminal=0 AND status=?"
)
_ON_CONFLICT_SET_ALL = "ON CONFLICT (process_id) DO UPDATE SET " + ", ".join(
    f"{column}=excluded.{column}" for column in _UPDATED_COLUMNS
)
_UPSERT = (
    f"INSERT INTO {{table}} ({RECORD_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?) "
    + _ON_CONFLICT_SET_ALL
)
_COLUMN_TYPES = (
    *("text", "bigint", "text", "integer", "integer"),
    *("text", "text", "text", "text", "bigint", "bigint", "text"),
)
"""The PostgreSQL type of each ``RECORD_COLUMNS`` column, in order."""
_COLUMN_ARRAYS = ", ".join(f"%b::{kind}[]" for kind in _COLUMN_TYPES)
"""One array parameter per ``RECORD_COLUMNS`` column, typed as the column (PostgreSQL only),
sent in binary (``%b``): psycopg writes a text array's text form by escaping every element in
Python, which for the records' JSON cost more than the whole statement on the server."""
_STORED_COLUMNS = ", ".join(f"{{table}}.{c}" for c in _UPDATED_COLUMNS)
_REBUILT_COLUMNS = ", ".join(f"excluded.{c}" for c in _UPDATED_COLUMNS)
_UPSERT_CHANGED = {
    # ``IS DISTINCT FROM`` / ``IS NOT``: NULL equals NULL, and values of different types (a
    # damaged row's BLOB against rebuilt text) differ.
    "postgresql": f"INSERT INTO {{table}} ({RECORD_COLUMNS}) "
    + f"SELECT * FROM unnest({_COLUMN_ARRAYS}) "
    + _ON_CONFLICT_SET_ALL
    + f" WHERE ({_STORED_COLUMNS}) IS DISTINCT FROM ({_REBUILT_COLUMNS})",
    "sqlite": _UPSERT + f" WHERE ({_STORED_COLUMNS}) IS NOT ({_REBUILT_COLUMNS})",
}
"""Insert each row, or update the stored one only where it differs in some column."""
_OPERATORS = frozenset({"=", ">=", "<", "<=", ">", "is null"})

Condition = tuple[str, str, object]
"""``(column, operator, value)`` over the records table; ``"is null"`` ignores the value."""


def where_clause(conditions: Sequence[Condition], prefix: str = "") -> tuple[str, list[object]]:
    """``(sql, params)`` for conditions that must all hold (``prefix`` = a table alias + ".")."""
    parts: list[str] = []
    params: list[object] = []
    for column, operator, value in conditions:
        if column not in _COLUMNS or operator not in _OPERATORS:
            raise ValueError(f"not a records condition: {column!r} {operator!r}")
        if operator == "is null":
            parts.append(f"{prefix}{column} IS NULL")
        else:
            parts.append(f"{prefix}{column}{operator}?")
            params.append(value)
    return " AND ".join(parts) or "1=1", params


def document_row(document: Mapping[str, Any]) -> tuple[object, ...]:
    """A row from a record's JSON form: no model round trip. (The domain's helpers are
    imported here, by the writers that need them: the CLI's fast path reads these rows
    without loading pydantic, docs/design.md §8.1.)"""
    from procledger.domain.model import canonical_json  # noqa: PLC0415 -- writers only
    from procledger.domain.registration import originator_scope_id  # noqa: PLC0415

    change_seq, status, terminal, waiting, updated_at_ms, record = _changing_values(document)
    definition = document["identity"]["definition"]
    return (
        document["id"],
        change_seq,
        status,
        terminal,
        waiting,
        originator_scope_id(document["originator"]),
        document["identity"]["kind"],
        document["identity"]["label"],
        None if definition is None else canonical_json(definition).decode(),
        document["created_at_ms"],
        updated_at_ms,
        record,
    )


def _changing_values(document: Mapping[str, Any]) -> tuple[object, ...]:
    """The ``_CHANGING_COLUMNS`` of a record's row."""
    return (
        document["change_seq"],
        document["status"],
        int(document["state"] in _TERMINAL_STATES),
        int(document["wait"] is not None),
        document["updated_at_ms"],
        orjson.dumps(document).decode(),
    )


def upsert_records(
    tx: Tx, documents: Iterable[Mapping[str, Any]], *, must_exist: Collection[str] = ()
) -> None:
    """Write records; those in ``must_exist`` (loaded, not created, by this write) must still
    have a row: a process pruned since the writer loaded it raises ``NotFound`` and the whole
    write rolls back, instead of resurrecting a partial log."""
    table = tx.dialect.table("records")
    fresh: list[tuple[object, ...]] = []
    for document in documents:
        if document["id"] in must_exist:
            update_record(tx, table, document)
        else:
            fresh.append(document_row(document))
    if fresh:
        tx.executemany(_UPSERT.format(table=table), fresh)


def update_record(tx: Tx, table: str, document: Mapping[str, Any]) -> None:
    """Update an existing row (``NotFound`` when there is none), leaving ``terminal`` and
    ``status`` alone while the process is going (see ``_UPDATE_GOING``)."""
    change_seq, status, terminal, waiting, updated_at_ms, record = _changing_values(document)
    process_id = document["id"]
    if not terminal:
        going = (change_seq, waiting, updated_at_ms, record, process_id, status)
        if tx.execute(_UPDATE_GOING.format(table=table), going).rowcount == 1:
            return
    values = (change_seq, status, terminal, waiting, updated_at_ms, record, process_id)
    if tx.execute(_UPDATE.format(table=table), values).rowcount == 0:
        raise NotFound(f"process {process_id!r} not found")


def lock_record(tx: Tx, process_id: str) -> Tx:
    """Lock the process's ``records`` row until commit, on a side cursor whose ``one()`` says
    whether it exists. Sent early in a batched write, it answers with the log read, and a row
    found locked needs no row count after its update (``upsert_records``' ``must_exist``)."""
    side = tx.side()
    side.execute(
        f"SELECT 1 AS present FROM {tx.dialect.table('records')} "
        f"WHERE process_id=?{tx.dialect.for_update}",
        (process_id,),
    )
    return side


def advance_tracking(tx: Tx, position: int) -> None:
    """Move the read models' log position forward (never back)."""
    tx.execute(
        f"UPDATE {tx.dialect.table('tracking')} SET position=? WHERE name='records' AND position<?",
        (position, position),
    )


def set_tracking(tx: Tx, position: int) -> None:
    tx.execute(
        f"UPDATE {tx.dialect.table('tracking')} SET position=? WHERE name='records'", (position,)
    )


def record_payload(tx: Tx, process_id: str) -> Any:
    """The stored record JSON of one process (text or UTF-8 bytes), or ``None``."""
    row = tx.execute(
        f"SELECT {tx.dialect.raw_text('record')} AS record FROM {tx.dialect.table('records')} "
        "WHERE process_id=?",
        (process_id,),
    ).one()
    return None if row is None else row["record"]


def select_records(
    tx: Tx,
    conditions: Sequence[Condition],
    limit: int | None = None,
    *,
    after: str | None = None,
    descending: bool = False,
) -> list[Any]:
    """``(process_id, record)`` rows matching ``conditions``, by id in code point order (from
    the end with ``descending``), past ``after`` in that order, at most ``limit``; the record is
    text or UTF-8 bytes (``Dialect.raw_text``). Pages follow an index on the filtered column
    and the id (``schema.py``), so a page costs its own rows, not the table's."""
    where, params = where_clause(conditions)
    order = f"process_id{tx.dialect.by_code_point}"
    if after is not None:
        where += f" AND {order}{'<' if descending else '>'}?"
        params.append(after)
    statement = (
        f"SELECT process_id, {tx.dialect.raw_text('record')} AS record "
        f"FROM {tx.dialect.table('records')} WHERE {where} "
        f"ORDER BY {order}{' DESC' if descending else ''}"
    )
    if limit is not None:
        statement += " LIMIT ?"
        params.append(limit)
    return tx.execute(statement, params).all()


def readable_records(
    tx: Tx, conditions: Sequence[Condition]
) -> tuple[list[tuple[Any, Any]], list[str]]:
    """In a damaged SQLite file: the ``(process_id, record)`` rows matching ``conditions``
    that can still be read, in no particular order, and what could not be read
    (``salvage``: the whole table is read, stepping over its bad pages)."""
    where, params = where_clause(conditions)
    raw, table = tx.dialect.raw_text, tx.dialect.table("records")
    columns = f"{raw('process_id')} AS process_id, {raw('record')} AS record"
    salvaged = readable_rows(tx, table, columns, where, params)
    rows = [(row["process_id"], row["record"]) for row in salvaged.rows]
    return rows, describe_unreadable(table, salvaged.unreadable)


def select_changed(tx: Tx, after: int, limit: int) -> list[Any]:
    """``(process_id, change_seq, record)`` rows changed after ``after``, in feed order."""
    return tx.execute(
        f"SELECT process_id, change_seq, {tx.dialect.raw_text('record')} AS record "
        f"FROM {tx.dialect.table('records')} WHERE change_seq>? "
        f"ORDER BY change_seq, process_id{tx.dialect.by_code_point} LIMIT ?",
        (after, limit),
    ).all()


def ids_from(tx: Tx, prefix: str, limit: int) -> list[str]:
    """Up to ``limit`` process ids that start with ``prefix``, by code point: a range on the
    primary key (``id >= prefix AND id < prefix + U+FFFF``), so the index answers it."""
    return _ids_in_range(tx, "process_id", prefix, limit)


def _ids_in_range(tx: Tx, column: str, prefix: str, limit: int, also: str = "") -> list[str]:
    """Up to ``limit`` process ids whose ``column`` (an expression over the id) starts with
    ``prefix`` (``>= prefix AND < prefix + U+FFFF``, by code point), in id order; ``also``:
    one more condition."""
    cp = tx.dialect.by_code_point
    rows = tx.execute(
        f"SELECT process_id FROM {tx.dialect.table('records')} "
        f"WHERE {also}{column}{cp}>=? AND {column}{cp}<? ORDER BY process_id{cp} LIMIT ?",
        (prefix, prefix + "\uffff", limit),
    ).all()
    return [str(row["process_id"]) for row in rows]


def ids_after(tx: Tx, after: Any, limit: int) -> list[Any]:
    """Up to ``limit`` process ids with a record, after ``after`` in the primary key's order:
    a rebuild sweeps rows the log no longer backs a page at a time, in memory flat in the
    number of processes. Ids as stored: text, or in a damaged SQLite file a BLOB (``bytes``,
    which sorts after every text), so that the last one read is where the next page starts."""
    rows = tx.execute(
        f"SELECT process_id FROM {tx.dialect.table('records')} WHERE process_id>? "
        "ORDER BY process_id LIMIT ?",
        (after, limit),
    ).all()
    return [row["process_id"] for row in rows]


def delete_ids(tx: Tx, process_ids: Sequence[str]) -> None:
    """Delete the records of these processes."""
    tx.executemany(
        f"DELETE FROM {tx.dialect.table('records')} WHERE process_id=?",
        [(process_id,) for process_id in process_ids],
    )


def is_terminal(tx: Tx, process_id: str) -> bool | None:
    """Whether the process's record is terminal; ``None`` when it has no record."""
    row = tx.execute(
        f"SELECT terminal FROM {tx.dialect.table('records')} WHERE process_id=?", (process_id,)
    ).one()
    return None if row is None else bool(row["terminal"])


def non_terminal_ids(tx: Tx) -> list[str]:
    """Ids of the non-terminal processes, in code point order (a PostgreSQL collation may order
    them otherwise, and recovery workers must agree on the order)."""
    rows = tx.execute(
        f"SELECT process_id FROM {tx.dialect.table('records')} WHERE terminal=0"
    ).all()
    return sorted(str(row["process_id"]) for row in rows)


def woken_by(tx: Tx, session_id: str) -> list[str]:
    """Ids of the processes whose wake target is ``session_id``."""
    target = tx.dialect.json_text("record", "wake_target", "session_id")
    rows = tx.execute(
        f"SELECT process_id FROM {tx.dialect.table('records')} WHERE {target}=? "
        "ORDER BY process_id",
        (session_id,),
    ).all()
    return [row["process_id"] for row in rows]


def prunable(
    tx: Tx, cutoff_ms: int, conditions: Sequence[Condition], up_to: int | None
) -> dict[str, int]:
    """``process_id -> change_seq`` of terminal records last updated before ``cutoff_ms``
    (and changed at or before ``up_to``) that match ``conditions``."""
    where, params = where_clause(conditions)
    statement = (
        f"SELECT process_id, change_seq FROM {tx.dialect.table('records')} "
        f"WHERE terminal=1 AND updated_at_ms<? AND {where}"
    )
    arguments: list[object] = [cutoff_ms, *params]
    if up_to is not None:
        statement += " AND change_seq<=?"
        arguments.append(up_to)
    rows = tx.execute(statement, arguments).all()
    return {row["process_id"]: int(row["change_seq"]) for row in rows}


def delete_terminal(tx: Tx, process_id: str, change_seq: int) -> bool:
    """Delete a terminal record still at ``change_seq``; ``False`` if it changed meanwhile."""
    tx.execute(
        f"DELETE FROM {tx.dialect.table('records')} "
        "WHERE process_id=? AND change_seq=? AND terminal=1",
        (process_id, change_seq),
    )
    return tx.rowcount == 1


def clear(tx: Tx) -> None:
    """Empty the table (a rebuild refills it in the same transaction)."""
    tx.execute(f"DELETE FROM {tx.dialect.table('records')}")


def bulk_insert(tx: Tx, rows: Sequence[Sequence[object]]) -> None:
    """Insert many ``document_row`` rows at once (COPY on PostgreSQL)."""
    bulk_load(tx, "records", RECORD_COLUMNS, rows)


def write_rebuilt(tx: Tx, rows: Sequence[Sequence[object]]) -> None:
    """Write a rebuild batch's ``document_row`` rows, only those that differ from the stored
    ones, compared whole by the store (``_UPSERT_CHANGED``): every row written costs its index
    pages and its share of the commit, and the rows need not be read back to be compared
    (docs/design.md §5.6). PostgreSQL takes the batch as one statement over column arrays;
    SQLite runs the statement per row, in the driver."""
    if not rows:
        return
    statement = _UPSERT_CHANGED[tx.dialect.name].format(table=tx.dialect.table("records"))
    if tx.dialect.name == "postgresql":
        tx.execute(statement, [list(column) for column in zip(*rows, strict=True)])
    else:
        tx.executemany(statement, rows)


_MARK = (
    f"INSERT INTO {{table}} ({RECORD_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?) "
    "ON CONFLICT (process_id) DO UPDATE SET record=excluded.record "
    "WHERE {table}.record {differs} excluded.record"
)
"""A marked row: inserted whole, or only its ``record`` replaced where it differs (a rebuild
of a ledger already marked writes nothing)."""


def mark_damaged(tx: Tx, marks: Sequence[tuple[str, str, Sequence[object] | None]]) -> None:
    """Mark processes damaged in the read model: each ``(process_id, why, row)`` leaves the
    process's ``records`` row holding ``{"damaged": why}`` instead of its record
    (``damage.damage_marker``, docs/design.md §13.5), its other columns -- what lists filter
    on -- as they were; a process without a row gets ``row`` (its fold's ``document_row``)
    with the marker in place of its record, or, with no ``row``, none."""
    table = tx.dialect.table("records")
    differs = "IS DISTINCT FROM" if tx.dialect.name == "postgresql" else "IS NOT"
    for process_id, why, row in marks:
        marker = damage_marker(why)
        if row is None:
            tx.execute(
                f"UPDATE {table} SET record=? WHERE process_id=? AND record {differs} ?",
                (marker, process_id, marker),
            )
        else:
            tx.execute(_MARK.format(table=table, differs=differs), (*row[:-1], marker))


def bulk_load(tx: Tx, table: str, columns: str, rows: Sequence[Sequence[object]]) -> None:
    """Insert many rows into a side table: COPY on PostgreSQL, executemany on SQLite."""
    if not rows:
        return
    name = tx.dialect.table(table)
    if tx.dialect.name == "postgresql":
        with tx.cursor.copy(f"COPY {name} ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        return
    marks = ",".join("?" * (columns.count(",") + 1))
    tx.executemany(f"INSERT INTO {name} ({columns}) VALUES ({marks})", rows)


def select_by_creation(
    tx: Tx,
    conditions: Sequence[Condition],
    limit: int | None = None,
    *,
    before: tuple[int, str] | None = None,
) -> list[Any]:
    """``(process_id, created_at_ms, record)`` rows matching ``conditions``, newest created
    first (ties by id, from the end), those created before ``before`` (``(created_at_ms,
    id)`` of the last row of the page before) -- the order of ``ps --limit`` ("the newest N",
    docs/design.md §8): an id names its creation time only when procledger minted it."""
    where, params = where_clause(conditions)
    order = f"process_id{tx.dialect.by_code_point}"
    if before is not None:
        where += f" AND (created_at_ms<? OR (created_at_ms=? AND {order}<?))"
        params += [before[0], before[0], before[1]]
    statement = (
        f"SELECT process_id, created_at_ms, {tx.dialect.raw_text('record')} AS record "
        f"FROM {tx.dialect.table('records')} WHERE {where} "
        f"ORDER BY created_at_ms DESC, {order} DESC"
    )
    if limit is not None:
        statement += " LIMIT ?"
        params.append(limit)
    return tx.execute(statement, params).all()


RANDOM_PART_AT = 13
"""Where the random part of a minted id (``<11 hex digits of ms>-<random>``) begins, counted
from 1 as SQL's ``substr`` does."""


def ids_by_random_part(tx: Tx, prefix: str, limit: int) -> list[str]:
    """Up to ``limit`` minted process ids whose random part (after the time and the dash)
    starts with ``prefix``, by code point: ``logs 1a2b`` names the process whose short id
    ``ps`` showed. A scan of the ids (a few milliseconds for thousands), not an index."""
    dash = f"substr(process_id, {RANDOM_PART_AT - 1}, 1)='-' AND "
    return _ids_in_range(tx, f"substr(process_id, {RANDOM_PART_AT})", prefix, limit, dash)


def matching_ids(tx: Tx, prefix: str, limit: int) -> list[str]:
    """Up to ``limit`` ids, sorted, that start with ``prefix`` or whose random part does
    (``domain.id_prefix``)."""
    found = set(ids_from(tx, prefix, limit)) | set(ids_by_random_part(tx, prefix, limit))
    return sorted(found)[:limit]
