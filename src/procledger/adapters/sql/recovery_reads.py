"""The reads a recovery pass makes: which processes are not terminal, and their leases.

Plain rows in, plain values out: the caller opens the transaction (one per visit, shared with
its record read) and decides what the rows mean (``procledger.recovery``).
"""

from __future__ import annotations

from typing import Any

from procledger.adapters.sql.store import Tx

__all__ = ["lease_row", "non_terminal_ids"]


def non_terminal_ids(tx: Tx) -> list[str]:
    """Ids of the non-terminal processes in the records read model, in code point order (a
    PostgreSQL collation may order them otherwise, and workers must agree on the order)."""
    rows = tx.execute(
        f"SELECT process_id FROM {tx.dialect.table('records')} WHERE terminal=0"
    ).all()
    return sorted(str(row["process_id"]) for row in rows)


def lease_row(tx: Tx, process_id: str) -> Any:
    """The process's ``leases`` row (released or not), or ``None`` if it was never claimed."""
    return tx.execute(
        f"SELECT owner, lease_token, fencing_token, claimed_at_ms, expires_at_ms, "
        f"released FROM {tx.dialect.table('leases')} WHERE process_id=?",
        (process_id,),
    ).one()
