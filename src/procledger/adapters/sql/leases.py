"""The ``leases`` table: one row per process ever claimed, holding the current holder, its
secret token and the fencing token that only ever grows.

Leases change on every renewal, so they live beside the log rather than in it (loading a
process stays cheap however often it was renewed)."""

from __future__ import annotations

from typing import Any

from procledger.adapters.sql.store import Tx


def ensure_row(tx: Tx, process_id: str) -> None:
    """A released placeholder row (fence 0) for a process never claimed, so the next read can
    lock it."""
    tx.execute(
        f"INSERT INTO {tx.dialect.table('leases')} (process_id, owner, lease_token, "
        "fencing_token, claimed_at_ms, expires_at_ms, released) "
        "VALUES (?, '{}', '', 0, 0, 0, 1) ON CONFLICT (process_id) DO NOTHING",
        (process_id,),
    )


def lease_row(tx: Tx, process_id: str, *, lock: bool = False) -> Any:
    """The process's lease row, or ``None``; ``lock`` holds it until commit (PostgreSQL)."""
    suffix = tx.dialect.for_update if lock else ""
    return tx.execute(
        f"SELECT * FROM {tx.dialect.table('leases')} WHERE process_id=?{suffix}",
        (process_id,),
    ).one()


def take(
    tx: Tx,
    process_id: str,
    *,
    owner_json: str,
    lease_token: str,
    fencing_token: int,
    claimed_at_ms: int,
    expires_at_ms: int,
) -> None:
    """Make the row a live lease of a new holder."""
    tx.execute(
        f"UPDATE {tx.dialect.table('leases')} SET owner=?, lease_token=?, fencing_token=?, "
        "claimed_at_ms=?, expires_at_ms=?, released=0 WHERE process_id=?",
        (owner_json, lease_token, fencing_token, claimed_at_ms, expires_at_ms, process_id),
    )


def extend(
    tx: Tx, process_id: str, lease_token: str, fencing_token: int, expires_at_ms: int
) -> None:
    tx.execute(
        f"UPDATE {tx.dialect.table('leases')} SET expires_at_ms=? "
        "WHERE process_id=? AND lease_token=? AND fencing_token=?",
        (expires_at_ms, process_id, lease_token, fencing_token),
    )


def release(tx: Tx, process_id: str, lease_token: str, fencing_token: int) -> None:
    tx.execute(
        f"UPDATE {tx.dialect.table('leases')} SET released=1 "
        "WHERE process_id=? AND lease_token=? AND fencing_token=?",
        (process_id, lease_token, fencing_token),
    )


def delete(tx: Tx, process_id: str) -> None:
    tx.execute(f"DELETE FROM {tx.dialect.table('leases')} WHERE process_id=?", (process_id,))
