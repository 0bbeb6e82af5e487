"""The ``grants`` read model table: which session holds a handle to which process."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from procledger.adapters.sql.record_rows import Condition, bulk_load, where_clause
from procledger.adapters.sql.store import Tx

GRANT_COLUMNS = "session_id, process_id, descriptor"
_CHUNK = 500


def upsert(tx: Tx, session_id: str, process_id: str, descriptor_json: str | None) -> None:
    tx.execute(
        f"INSERT INTO {tx.dialect.table('grants')} ({GRANT_COLUMNS}) VALUES (?,?,?) "
        "ON CONFLICT (session_id, process_id) DO UPDATE SET descriptor=excluded.descriptor",
        (session_id, process_id, descriptor_json),
    )


def delete(tx: Tx, session_id: str, process_id: str) -> None:
    tx.execute(
        f"DELETE FROM {tx.dialect.table('grants')} WHERE session_id=? AND process_id=?",
        (session_id, process_id),
    )


def _granted(tx: Tx) -> str:
    return (
        "SELECT g.process_id AS process_id, g.descriptor AS descriptor, "
        f"{tx.dialect.raw_text('r.record')} AS record "
        f"FROM {tx.dialect.table('grants')} g JOIN {tx.dialect.table('records')} r "
        "ON r.process_id = g.process_id WHERE g.session_id=?"
    )


def granted_row(tx: Tx, session_id: str, process_id: str) -> Any:
    """``(process_id, descriptor, record)`` of one grant, or ``None``."""
    return tx.execute(_granted(tx) + " AND g.process_id=?", (session_id, process_id)).one()


def granted_rows(tx: Tx, session_id: str, conditions: Sequence[Condition]) -> list[Any]:
    """``(process_id, descriptor, record)`` of the session's grants whose records match."""
    where, params = where_clause(conditions, "r.")
    return tx.execute(
        _granted(tx) + f" AND {where} ORDER BY g.process_id{tx.dialect.by_code_point}",
        (session_id, *params),
    ).all()


def sessions_of(tx: Tx, process_id: str) -> list[str]:
    """The sessions holding a grant on the process, by code point."""
    rows = tx.execute(
        f"SELECT session_id FROM {tx.dialect.table('grants')} WHERE process_id=? "
        f"ORDER BY session_id{tx.dialect.by_code_point}",
        (process_id,),
    ).all()
    return [row["session_id"] for row in rows]


def held_elsewhere(tx: Tx, process_id: str, session_id: str) -> bool:
    """Whether a session other than ``session_id`` holds a grant on the process."""
    row = tx.execute(
        f"SELECT 1 AS held FROM {tx.dialect.table('grants')} WHERE process_id=? AND session_id<>?",
        (process_id, session_id),
    ).one()
    return row is not None


def grants_on(tx: Tx, process_ids: Sequence[str]) -> set[tuple[str, str]]:
    """``(session_id, process_id)`` of every grant on these processes."""
    found: set[tuple[str, str]] = set()
    for start in range(0, len(process_ids), _CHUNK):
        chunk = list(process_ids[start : start + _CHUNK])
        marks = ",".join("?" * len(chunk))
        rows = tx.execute(
            f"SELECT session_id, process_id FROM {tx.dialect.table('grants')} "
            f"WHERE process_id IN ({marks})",
            chunk,
        ).all()
        found.update((row["session_id"], row["process_id"]) for row in rows)
    return found


def clear(tx: Tx) -> None:
    tx.execute(f"DELETE FROM {tx.dialect.table('grants')}")


def replace_sessions(tx: Tx, session_ids: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Replace every grant of these sessions by ``rows`` (a rebuild batch)."""
    tx.executemany(
        f"DELETE FROM {tx.dialect.table('grants')} WHERE session_id=?",
        [(session_id,) for session_id in session_ids],
    )
    if rows:
        tx.executemany(
            f"INSERT INTO {tx.dialect.table('grants')} ({GRANT_COLUMNS}) VALUES (?,?,?)", rows
        )


def rows_of_sessions(tx: Tx, session_ids: Sequence[str]) -> set[tuple[object, ...]]:
    """``(session_id, process_id, descriptor)`` of every grant of these sessions."""
    found: set[tuple[object, ...]] = set()
    for start in range(0, len(session_ids), _CHUNK):
        chunk = list(session_ids[start : start + _CHUNK])
        rows = tx.execute(
            f"SELECT {GRANT_COLUMNS} FROM {tx.dialect.table('grants')} "
            f"WHERE session_id IN ({','.join('?' * len(chunk))})",
            chunk,
        ).all()
        found.update((row["session_id"], row["process_id"], row["descriptor"]) for row in rows)
    return found


def session_ids(tx: Tx) -> list[str]:
    """Every session holding a grant."""
    rows = tx.execute(f"SELECT DISTINCT session_id FROM {tx.dialect.table('grants')}").all()
    return [str(row["session_id"]) for row in rows]


def delete_sessions_except(tx: Tx, kept: set[str]) -> None:
    """Delete the grants of every session not in ``kept`` (sessions the log no longer has)."""
    replace_sessions(tx, [s for s in session_ids(tx) if s not in kept], [])


def bulk_insert(tx: Tx, rows: Sequence[Sequence[object]]) -> None:
    bulk_load(tx, "grants", GRANT_COLUMNS, rows)
