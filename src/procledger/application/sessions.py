"""Deleting a session: revoke its grants and clear the wake targets that point at it, in one
write, and report which of its processes nobody else holds any more."""

from __future__ import annotations

from procledger.adapters.sql import grant_rows, record_rows
from procledger.adapters.sql.store import Tx
from procledger.application.retry import retry_on_conflict
from procledger.application.unit_of_work import Ledger
from procledger.domain.errors import NotFound, WriteConflict
from procledger.domain.process import Process
from procledger.projections.reports import SessionDeleteReport


def classify(tx: Tx, session_id: str, held: list[str]) -> tuple[list[str], list[str]]:
    """``(orphaned, preserved)``: held non-terminal processes, by whether others hold them."""
    orphaned: list[str] = []
    preserved: list[str] = []
    for process_id in held:
        if record_rows.is_terminal(tx, process_id) is not False:
            continue  # terminal, or gone
        if grant_rows.held_elsewhere(tx, process_id, session_id):
            preserved.append(process_id)
        else:
            orphaned.append(process_id)
    return orphaned, preserved


def delete_session(ledger: Ledger, session_id: str) -> SessionDeleteReport:
    """Revoke every grant of the session and clear wake targets pointing at it (one write).

    Raises:
        StoreError: the deletion kept conflicting with concurrent writes.
    """

    def attempt() -> SessionDeleteReport:
        now = ledger.now_ms()
        session = ledger.load_session(session_id)
        held = sorted(session.grants) if session is not None else []
        woken, (orphaned, preserved) = ledger.store.attempt(
            lambda tx: (record_rows.woken_by(tx, session_id), classify(tx, session_id, held))
        )
        processes = _cleared_wake_targets(ledger, woken, session_id, now)
        for process_id in held:
            assert session is not None
            session.revoke(process_id, at_ms=now)
        try:
            ledger.save(processes, [session] if session is not None else [], now_ms=now)
        except NotFound as pruned:  # a process was pruned meanwhile: decide again
            raise WriteConflict(f"session {session_id!r}: {pruned}") from pruned
        return SessionDeleteReport(
            session_id=session_id,
            revoked_handle_count=len(held),
            deleted_wake_count=len(processes),
            orphaned_process_ids=orphaned,
            preserved_process_ids=preserved,
        )

    return retry_on_conflict(attempt, f"session {session_id!r}: deletion")


def _cleared_wake_targets(
    ledger: Ledger, woken: list[str], session_id: str, now: int
) -> list[Process]:
    processes: list[Process] = []
    for process_id in woken:
        try:
            process = ledger.load_process(process_id)
        except NotFound:
            continue  # pruned meanwhile
        if process.clear_wake_target(session_id, at_ms=now):
            processes.append(process)
    return processes
