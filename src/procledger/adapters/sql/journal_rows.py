"""The ``journal`` table: completion notifications as commands, stored before dispatch and
unique by command id. ``consumed`` is the only column that ever changes."""

from __future__ import annotations

from typing import Any

from procledger.adapters.sql.store import Tx

_COLUMNS = "seq, command_id, payload, consumed"


def entry(tx: Tx, command_id: str) -> Any:
    """``(seq, command_id, payload, consumed)`` of one command, or ``None``."""
    return tx.execute(
        f"SELECT {_COLUMNS} FROM {tx.dialect.table('journal')} WHERE command_id=?",
        (command_id,),
    ).one()


def insert(
    tx: Tx, command_id: str, *, session_id: str, loop_id: str, process_handle: str, payload: str
) -> bool:
    """Journal a command unless its id is there already; ``True`` when this wrote the row."""
    tx.execute(
        f"INSERT INTO {tx.dialect.table('journal')} (command_id, session_id, loop_id, "
        "process_handle, payload) VALUES (?, ?, ?, ?, ?) ON CONFLICT (command_id) DO NOTHING",
        (command_id, session_id, loop_id, process_handle, payload),
    )
    return tx.rowcount == 1


def mark_consumed(tx: Tx, command_id: str, session_id: str, loop_id: str) -> bool:
    tx.execute(
        f"UPDATE {tx.dialect.table('journal')} SET consumed=1 "
        "WHERE command_id=? AND session_id=? AND loop_id=?",
        (command_id, session_id, loop_id),
    )
    return tx.rowcount == 1


def unconsumed(tx: Tx, session_id: str, loop_id: str) -> list[Any]:
    """The loop's unconsumed entries, in journal order."""
    return tx.execute(
        f"SELECT {_COLUMNS} FROM {tx.dialect.table('journal')} "
        "WHERE session_id=? AND loop_id=? AND consumed=0 ORDER BY seq",
        (session_id, loop_id),
    ).all()


def entries(tx: Tx, session_id: str | None = None) -> list[Any]:
    """Every entry (or one session's), in journal order."""
    where, params = ("WHERE session_id=? ", (session_id,)) if session_id else ("", ())
    return tx.execute(
        f"SELECT {_COLUMNS} FROM {tx.dialect.table('journal')} {where}ORDER BY seq", params
    ).all()


def delete_for_process(tx: Tx, process_id: str) -> None:
    """Delete the journal entries addressed through the process's handles."""
    tx.execute(
        f"DELETE FROM {tx.dialect.table('journal')} WHERE process_handle IN "
        f"(SELECT handle FROM {tx.dialect.table('handles')} WHERE process_id=?)",
        (process_id,),
    )
