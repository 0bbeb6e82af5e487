"""Handle summaries and session deletion, over the ``grants`` and ``records`` read models."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from eventsourcing.persistence import IntegrityError

from procledger.adapters.store import Store, Tx
from procledger.domain.errors import NotFound, StoreError
from procledger.domain.process import Process
from procledger.domain.registration import HandleDescriptor
from procledger.domain.vocabulary import ProcessStatus
from procledger.projections.feed import by_code_point
from procledger.projections.filters import ProcessListFilter
from procledger.projections.handles import HandleSummary
from procledger.projections.records import decode_record, read_record
from procledger.projections.reports import SessionDeleteReport

if TYPE_CHECKING:
    from procledger.registry import ProcessRegistry

_ATTEMPTS = 50


def not_visible(process_id: str) -> NotFound:
    """One message for "not granted to you" and "does not exist": a session learns nothing."""
    return NotFound(f"process {process_id!r} not found")


def _summary(row: Any) -> HandleSummary:
    record = decode_record(row["process_id"], row["record"])
    descriptor = (
        HandleDescriptor.model_validate(orjson.loads(row["descriptor"]))
        if row["descriptor"] is not None
        else record.descriptor
        or HandleDescriptor(kind=record.identity.kind, label=record.identity.label)
    )
    return HandleSummary(
        process_id=record.id,
        descriptor=descriptor,
        status=ProcessStatus(record.status),
        definition=record.identity.definition,
    )


def _granted(store: Store) -> str:
    return (
        f"SELECT g.process_id AS process_id, g.descriptor AS descriptor, r.record AS record "
        f"FROM {store.table('grants')} g JOIN {store.table('records')} r "
        "ON r.process_id = g.process_id WHERE g.session_id=?"
    )


def read_handle(tx: Tx, store: Store, session_id: str, process_id: str) -> HandleSummary:
    row = tx.execute(_granted(store) + " AND g.process_id=?", (session_id, process_id)).one()
    if row is None:
        raise not_visible(process_id)
    return _summary(row)


def read_handles(
    tx: Tx, store: Store, session_id: str, selection: ProcessListFilter
) -> list[HandleSummary]:
    where, params = selection.sql("r.")
    rows = tx.execute(
        _granted(store) + f" AND {where} ORDER BY g.process_id{by_code_point(store)}",
        (session_id, *params),
    ).all()
    return [_summary(row) for row in rows]


def read_handle_sessions(tx: Tx, store: Store, process_id: str) -> list[str]:
    if read_record(tx, store, process_id) is None:
        raise NotFound(f"process {process_id!r} not found")
    rows = tx.execute(
        f"SELECT session_id FROM {store.table('grants')} WHERE process_id=? "
        f"ORDER BY session_id{by_code_point(store)}",
        (process_id,),
    ).all()
    return [row["session_id"] for row in rows]


def _wake_target_session(store: Store) -> str:
    if store.dialect == "postgresql":
        return "(record::jsonb -> 'wake_target' ->> 'session_id')"
    return "json_extract(record, '$.wake_target.session_id')"


def _woken_by(tx: Tx, store: Store, session_id: str) -> list[str]:
    rows = tx.execute(
        f"SELECT process_id FROM {store.table('records')} "
        f"WHERE {_wake_target_session(store)}=? ORDER BY process_id",
        (session_id,),
    ).all()
    return [row["process_id"] for row in rows]


def _classify(
    tx: Tx, store: Store, session_id: str, held: list[str]
) -> tuple[list[str], list[str]]:
    """``(orphaned, preserved)``: held non-terminal processes, by whether others hold them."""
    orphaned: list[str] = []
    preserved: list[str] = []
    for process_id in held:
        row = tx.execute(
            f"SELECT terminal FROM {store.table('records')} WHERE process_id=?", (process_id,)
        ).one()
        if row is None or row["terminal"]:
            continue
        other = tx.execute(
            f"SELECT 1 AS held FROM {store.table('grants')} WHERE process_id=? AND session_id<>?",
            (process_id, session_id),
        ).one()
        (preserved if other is not None else orphaned).append(process_id)
    return orphaned, preserved


def delete_session(registry: ProcessRegistry, session_id: str) -> SessionDeleteReport:
    store = registry.store
    for _ in range(_ATTEMPTS):
        now = registry.now_ms()
        session = registry._load_session(session_id)
        held = sorted(session.grants) if session is not None else []
        with store.read() as tx:
            woken = _woken_by(tx, store, session_id)
            orphaned, preserved = _classify(tx, store, session_id, held)
        processes: list[Process] = []
        for process_id in woken:
            try:
                process = registry._load(process_id)
            except NotFound:
                continue  # pruned meanwhile
            if process.clear_wake_target(session_id, at_ms=now):
                processes.append(process)
        sessions = []
        if session is not None:
            for process_id in held:
                session.revoke(process_id, at_ms=now)
            sessions.append(session)
        try:
            registry._save(processes, sessions, now_ms=now)
        except (IntegrityError, NotFound):
            continue
        return SessionDeleteReport(
            session_id=session_id,
            revoked_handle_count=len(held),
            deleted_wake_count=len(processes),
            orphaned_process_ids=orphaned,
            preserved_process_ids=preserved,
        )
    raise StoreError(f"session {session_id!r}: deletion kept conflicting")
