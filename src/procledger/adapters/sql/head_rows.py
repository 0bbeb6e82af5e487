"""The ``heads`` side table and the reads that check the log's integrity (docs/design.md §13).

Each process's events form a hash chain: every event after the first stores the digest of its
predecessor. The chain alone cannot reveal an edited or deleted *last* event, so ``heads`` keeps
one row per process — the version and digest of its last event — written in the transaction of
every append and deleted with the process by retention. ``verify`` compares it with the log.

The ``chain`` row of the ``tracking`` table is the notification id the log had reached when a
chaining procledger first opened the ledger: events after it must be chained, events at or
before it were written before chains existed (``unchained``, not a failure).

Plain rows in, plain values out: the caller opens the transaction and computes digests.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, NamedTuple
from uuid import UUID

import orjson

from procledger.adapters.sql import salvage
from procledger.adapters.sql.damage import chain_fault
from procledger.adapters.sql.record_rows import RECORD_COLUMNS
from procledger.adapters.sql.salvage import describe_unreadable, readable_rows
from procledger.adapters.sql.sqlite_files import is_damage
from procledger.adapters.sql.store import Store, Tx

__all__ = [
    "CHAIN_TRACKING",
    "RECORD_NAMES",
    "Undecodable",
    "all_heads",
    "chain_since",
    "create_statements",
    "damaged_trees",
    "delete",
    "env_rows",
    "grant_rows",
    "head_in",
    "heads_of",
    "integrity_problems",
    "last_event",
    "record_rows",
    "select_head",
    "text_of",
    "upsert",
]

RECORD_NAMES = tuple(name.strip() for name in RECORD_COLUMNS.split(","))

CHAIN_TRACKING = "chain"
"""The ``tracking`` row naming the log position after which every event is chained."""


def upsert(tx: Tx, rows: list[tuple[str, int, str]]) -> None:
    """Record ``(process_id, version, digest)`` as each process's last event."""
    if not rows:
        return
    tx.executemany(
        f"INSERT INTO {tx.dialect.table('heads')} (process_id, version, digest) VALUES (?,?,?) "
        "ON CONFLICT (process_id) DO UPDATE SET version=excluded.version, digest=excluded.digest",
        rows,
    )


def delete(tx: Tx, process_id: str) -> None:
    tx.execute(f"DELETE FROM {tx.dialect.table('heads')} WHERE process_id=?", (process_id,))


class Undecodable(NamedTuple):
    """A stored text value that is not UTF-8 -- a SQLite file may hold any bytes in a text
    column -- kept as its bytes, so that one such row is one problem named by the verifier,
    not a read that fails for the whole table."""

    raw: bytes

    def __str__(self) -> str:
        return f"{self.raw!r} (not UTF-8)"


def text_of(value: Any) -> Any:
    """A text column read raw (``Dialect.raw_text``): its text, ``Undecodable`` when its bytes
    are not UTF-8, or the value as stored when it is no text (``None``, a number)."""
    if isinstance(value, bytes | memoryview):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return Undecodable(bytes(value))
    return value


def all_heads(tx: Tx, unreadable: list[str] | None = None) -> dict[Any, tuple[Any, Any]] | None:
    """``process_id -> (version, digest)`` for every process that has a head row; each value
    as stored, text as ``text_of`` reads it (a damaged SQLite file may hold anything there:
    the verifier says so). In a damaged file (``unreadable`` given) ``None`` when the table
    cannot be read whole -- it has no rowid to step over a bad page by -- said in
    ``unreadable``."""
    raw = tx.dialect.raw_text
    table = tx.dialect.table("heads")
    try:
        rows = tx.execute(
            f"SELECT {raw('process_id')} AS process_id, version, {raw('digest')} AS digest "
            f"FROM {table}"
        ).all()
    except sqlite3.DatabaseError as error:
        if unreadable is None or not is_damage(error):
            raise
        unreadable.append(f"the table {table} could not be read: its heads were not checked")
        return None
    return {text_of(row["process_id"]): (row["version"], text_of(row["digest"])) for row in rows}


def _rows(tx: Tx, table: str, columns: str, unreadable: list[str] | None) -> list[Any]:
    """Every row of side table ``table``: read whole, or -- in a damaged file, when
    ``unreadable`` is given -- what can be read of it (``salvage``), the rest said there."""
    name = tx.dialect.table(table)
    if unreadable is None:
        return tx.execute(f"SELECT {columns} FROM {name}").all()
    salvaged = readable_rows(tx, name, columns)
    unreadable.extend(describe_unreadable(name, salvaged.unreadable))
    return salvaged.rows


def last_event(tx: Tx, key: UUID, version: int) -> Any:
    """The event at ``version`` of one stream (``topic``, ``state``), or ``None``: the
    predecessor of an event about to be appended by a writer that did not read the log."""
    return tx.execute(
        f"SELECT topic, state FROM {tx.dialect.events_table} "
        "WHERE originator_id=? AND originator_version=?",
        (tx.dialect.originator_key(key), version),
    ).one()


def chain_since(tx: Tx) -> Any:
    """The log position after which every event must be chained (0 when the row is missing:
    everything must then be), as stored (a damaged SQLite file may hold any value there: the
    verifier says so); ``None`` for a ledger no chaining procledger has written to (it has no
    ``heads`` table: one of 0.1.0, opened read-only), none of whose events is chained."""
    if tx.execute(*tx.dialect.table_exists("heads")).one() is None:
        return None
    row = tx.execute(
        f"SELECT position FROM {tx.dialect.table('tracking')} WHERE name=?", (CHAIN_TRACKING,)
    ).one()
    return 0 if row is None else row["position"]


def select_head(tx: Tx, process_id: str) -> Tx:
    """Send the read of one process's head row on ``tx`` (a side cursor, in a batched write,
    so that it travels with the log read); ``head_in`` reads its answer."""
    raw = tx.dialect.raw_text
    return tx.execute(
        f"SELECT version, {raw('digest')} AS digest FROM {tx.dialect.table('heads')} "
        "WHERE process_id=?",
        (process_id,),
    )


def head_in(sent: Tx) -> tuple[Any, Any] | None:
    """``(version, digest)`` of the head row ``select_head`` sent, as stored, or ``None``."""
    row = sent.one()
    return None if row is None else (row["version"], text_of(row["digest"]))


def heads_of(tx: Tx, process_ids: Sequence[str]) -> dict[str, tuple[Any, Any]]:
    """``process_id -> (version, digest)`` of these processes' head rows (one statement: the
    ids as one parameter, a JSON array walked by ``json_each`` on SQLite, an array on
    PostgreSQL), each value as stored."""
    if not process_ids:
        return {}
    raw = tx.dialect.raw_text
    ids: Any = list(process_ids)
    within = "= ANY(?)"
    if tx.dialect.name != "postgresql":
        ids, within = orjson.dumps(ids).decode(), "IN (SELECT value FROM json_each(?))"
    rows = tx.execute(
        f"SELECT process_id, version, {raw('digest')} AS digest "
        f"FROM {tx.dialect.table('heads')} WHERE process_id {within}",
        (ids,),
    ).all()
    return {str(row["process_id"]): (row["version"], text_of(row["digest"])) for row in rows}


def integrity_problems(tx: Tx) -> list[str] | None:
    """What the database's own check finds (SQLite ``PRAGMA integrity_check``, one line per
    problem; empty: none), or ``None`` where there is no cheap check (PostgreSQL: without
    amcheck only a read of the log's extent, which fails on a broken index or heap page it
    touches)."""
    if tx.dialect.name == "postgresql":
        tx.execute(
            f"SELECT COUNT(*) AS n, MAX({tx.dialect.notification_id}) AS m "
            f"FROM {tx.dialect.events_table}"
        ).one()
        return None
    try:
        rows = tx.execute("PRAGMA integrity_check").all()
    except sqlite3.DatabaseError as error:  # a page so damaged that the check stops at it
        if not is_damage(error):
            raise
        return [str(error)]
    found = [line for row in rows for line in str(row["integrity_check"]).splitlines()]
    return [] if found == ["ok"] else [line for line in found if not line.startswith("***")]


def damaged_trees(tx: Tx, problems: Sequence[str]) -> dict[str, list[int]]:
    """The tables and indexes whose pages ``problems`` (SQLite's) name, with those pages."""
    return salvage.damaged_trees(tx, problems)


def create_statements(store: Store) -> list[str]:
    """The ``heads`` table, and the ``chain`` tracking row, set once to the log's current end
    (so the events of a ledger written before chains existed read as unchained)."""
    return [
        f"""CREATE TABLE IF NOT EXISTS {store.table("heads")} (
            process_id TEXT PRIMARY KEY,
            version {store.dialect.big_integer} NOT NULL,
            digest TEXT NOT NULL){store.dialect.keyed_only}""",
        f"INSERT INTO {store.table('tracking')} (name, position) "
        f"SELECT '{CHAIN_TRACKING}', COALESCE(MAX({store.dialect.notification_id}), 0) "
        f"FROM {store.events_table} WHERE 1=1 ON CONFLICT (name) DO NOTHING",
    ]


_TEXT_COLUMNS = frozenset(
    {"process_id", "status", "originator_scope_id", "identity_kind", "identity_label"}
    | {"definition", "record"}
)
"""The ``records`` columns that hold text; the others hold integers."""


def record_rows(tx: Tx, unreadable: list[str] | None = None) -> dict[Any, tuple[Any, ...]]:
    """Every ``records`` row as stored, by process id (columns in ``RECORD_COLUMNS`` order,
    text as ``text_of`` reads it; the record as its raw text or bytes): what a verification
    compares with the rows a rebuild would write. ``unreadable``: see ``_rows``."""
    raw = tx.dialect.raw_text
    columns = ", ".join(
        f"{raw(name)} AS {name}" if name in _TEXT_COLUMNS else name for name in RECORD_NAMES
    )
    rows = _rows(tx, "records", columns, unreadable)
    return {
        text_of(row["process_id"]): tuple(
            row[name] if name == "record" else text_of(row[name]) for name in RECORD_NAMES
        )
        for row in rows
    }


def grant_rows(tx: Tx, unreadable: list[str] | None = None) -> set[tuple[Any, Any, Any]]:
    """Every ``grants`` row as stored: ``(session_id, process_id, descriptor)``, text as
    ``text_of`` reads it. ``unreadable``: see ``_rows``."""
    raw = tx.dialect.raw_text
    columns = f"{raw('session_id')} AS s, {raw('process_id')} AS p, {raw('descriptor')} AS d"
    rows = _rows(tx, "grants", columns, unreadable)
    return {(text_of(row["s"]), text_of(row["p"]), text_of(row["d"])) for row in rows}


def env_rows(tx: Tx, unreadable: list[str] | None = None) -> list[tuple[Any, Any]]:
    """Every ``envs`` row: ``(env_ref, stored text)``, as ``text_of`` reads them.
    ``unreadable``: see ``_rows``."""
    raw = tx.dialect.raw_text
    rows = _rows(tx, "envs", f"{raw('env_ref')} AS r, {raw('env')} AS e", unreadable)
    return [(text_of(row["r"]), text_of(row["e"])) for row in rows]


def log_fault(
    tx: Tx, process_id: str, rows: Sequence[Any], since: Any, *, whole: bool, head: Tx | None = None
) -> str | None:
    """Why one process's events ``rows`` (to the end of its log; ``whole``: from its first) do
    not verify against each other and its head row (``damage.chain_fault``; ``head``: the head
    row's read, already sent), or ``None``. ``since`` is ``chain_since``'s position: ``None``,
    a ledger without chains, verifies nothing. The registry's reads and writes and the CLI's
    fast path check a log by this one function (docs/design.md §13.1, §8.1)."""
    if since is None:
        return None
    stored = head_in(head if head is not None else select_head(tx, process_id))
    events = [
        (row["position"], row["originator_version"], row["topic"], row["state"]) for row in rows
    ]
    return chain_fault(events, stored, since, whole=whole)
