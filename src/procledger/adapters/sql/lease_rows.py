"""The ``leases`` table: one row per process ever claimed, holding the current holder, its
secret token and the fencing token that only ever grows.

Leases change on every renewal, so they live beside the log rather than in it (loading a
process stays cheap however often it was renewed)."""

from __future__ import annotations

from typing import Any

from procledger.adapters.sql.store import Tx


def ensure_locked(tx: Tx, process_id: str) -> Any:
    """The process's lease row, created as a released placeholder (fence 0) if missing, and
    locked until commit: an insert and a ``lease_row(lock=True)`` in one statement (one
    round trip). The no-op update on conflict is what locks an existing row, as a
    ``SELECT ... FOR UPDATE`` would, and returns it as it is."""
    return tx.execute(
        f"INSERT INTO {tx.dialect.table('leases')} (process_id, owner, lease_token, "
        "fencing_token, claimed_at_ms, expires_at_ms, released) "
        "VALUES (?, '{}', '', 0, 0, 0, 1) "
        "ON CONFLICT (process_id) DO UPDATE SET process_id=excluded.process_id RETURNING *",
        (process_id,),
    ).one()


def lease_row(tx: Tx, process_id: str, *, lock: bool = False) -> Any:
    """The process's lease row, or ``None``; ``lock`` holds it until commit (PostgreSQL)."""
    return select_lease(tx, process_id, lock=lock).one()


def select_lease(tx: Tx, process_id: str, *, lock: bool = False) -> Tx:
    """``lease_row``'s statement, its answer left on ``tx`` (``one()``) to read later."""
    suffix = tx.dialect.for_update if lock else ""
    return tx.execute(
        f"SELECT * FROM {tx.dialect.table('leases')} WHERE process_id=?{suffix}",
        (process_id,),
    )


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


_LEASE_COLUMNS = "l.owner, l.lease_token, l.fencing_token, l.claimed_at_ms, l.expires_at_ms"


def next_free(tx: Tx, after: str, now_ms: int) -> Any:
    """The first process after ``after`` (by id) that has not ended and whose lease looked
    free -- never claimed, released, or expired at ``now_ms`` -- as ``(process_id, record)``,
    or ``None``.

    The record row stays locked until ``tx`` ends, and rows other transactions hold are
    passed over (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; SQLite's writer lock admits one
    such transaction at a time): recovery workers searching at once never wait for, nor
    return, a process another of them is taking. On PostgreSQL the lease columns are those of
    the statement's snapshot: a claim that committed while it ran is seen only by reading the
    lease row again (``lease_row``)."""
    records, leases = tx.dialect.table("records"), tx.dialect.table("leases")
    return tx.execute(
        f"SELECT r.process_id, {tx.dialect.raw_text('r.record')} AS record "
        f"FROM {records} r LEFT JOIN {leases} l ON l.process_id = r.process_id "
        "WHERE r.terminal=0 AND r.process_id>? "
        "AND (l.process_id IS NULL OR l.released=1 OR l.expires_at_ms<=?) "
        f"ORDER BY r.process_id LIMIT 1{tx.dialect.skip_locked('r')}",
        (after, now_ms),
    ).one()


def is_held(row: Any, now_ms: int) -> bool:
    """Whether a lease row is a live lease at ``now_ms`` (neither released nor expired)."""
    return row is not None and not row["released"] and int(row["expires_at_ms"]) > now_ms


def held(tx: Tx, now_ms: int) -> list[Any]:
    """The live leases (not released, not expired at ``now_ms``) of processes that have not
    ended, as lease rows with their ``process_id``."""
    records, leases = tx.dialect.table("records"), tx.dialect.table("leases")
    return tx.execute(
        f"SELECT l.process_id, {_LEASE_COLUMNS} FROM {leases} l "
        f"JOIN {records} r ON r.process_id = l.process_id "
        "WHERE r.terminal=0 AND l.released=0 AND l.expires_at_ms>? ORDER BY l.process_id",
        (now_ms,),
    ).all()
