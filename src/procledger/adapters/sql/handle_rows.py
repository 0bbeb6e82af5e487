"""The statements of the Supervisor's ``handles`` side table, and its stop-request poll.

Plain rows in, plain rows out: the caller opens the transaction and turns rows into its own
values (``procledger.application.handle_addresses``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from procledger.adapters.sql.store import Tx

__all__ = ["change_seqs", "delete_for_process", "first_handle_row", "upsert_handle"]

BATCH: Final = 500
"""Ids per ``IN (...)`` list: well below every driver's parameter limit."""


def upsert_handle(
    tx: Tx,
    *,
    handle: str,
    process_id: str,
    owner_id: str,
    session_id: str | None,
    loop_id: str | None,
    command_id: str,
) -> None:
    """Insert the handle, or update where its notification goes (a retried ``start``)."""
    tx.execute(
        f"INSERT INTO {tx.dialect.table('handles')} "
        "(handle, process_id, owner_id, session_id, loop_id, command_id) "
        "VALUES (?,?,?,?,?,?) ON CONFLICT (handle) DO UPDATE SET "
        "owner_id=excluded.owner_id, session_id=excluded.session_id, "
        "loop_id=excluded.loop_id, command_id=excluded.command_id",
        (handle, process_id, owner_id, session_id, loop_id, command_id),
    )


def first_handle_row(tx: Tx, process_id: str) -> Any:
    """The process's first handle row (a retried start may have minted more), or ``None``."""
    return tx.execute(
        f"SELECT * FROM {tx.dialect.table('handles')} WHERE process_id=? ORDER BY handle LIMIT 1",
        (process_id,),
    ).one()


def change_seqs(tx: Tx, process_ids: Sequence[str]) -> dict[str, int]:
    """The change-feed position of each listed process's record (absent ones are left out),
    in as few queries as the batch size allows."""
    found: dict[str, int] = {}
    for start in range(0, len(process_ids), BATCH):
        batch = process_ids[start : start + BATCH]
        marks = ",".join("?" * len(batch))
        rows = tx.execute(
            f"SELECT process_id, change_seq FROM {tx.dialect.table('records')} "
            f"WHERE process_id IN ({marks})",
            tuple(batch),
        ).all()
        found.update((str(row["process_id"]), int(row["change_seq"])) for row in rows)
    return found


def delete_for_process(tx: Tx, process_id: str) -> None:
    """Delete the process's handles (retention; its journal entries go first)."""
    tx.execute(f"DELETE FROM {tx.dialect.table('handles')} WHERE process_id=?", (process_id,))


def latest_change_seq(tx: Tx) -> int:
    """The newest change-feed position of any record (0 with none): one indexed read that
    says whether anything changed since a position seen before."""
    row = tx.execute(
        f"SELECT COALESCE(MAX(change_seq), 0) AS latest FROM {tx.dialect.table('records')}", ()
    ).one()
    return int(row["latest"])
