"""Retention: delete old terminal processes with everything that refers to them.

One prune is one transaction (appended events and deletions commit together):

- the candidates are the terminal records with ``updated_at_ms < cutoff_ms`` (and
  ``change_seq <= up_to``) matching the filter — never a non-terminal process;
- their events leave the log, their ``records``, ``leases`` and ``handles`` rows and the
  journal entries of those handles go;
- their grants are revoked with ``Session.Revoked`` events (so a rebuild does not bring them
  back), and a ``Retention.Pruned`` event records the prune. That event also keeps the log's
  high-water mark: SQLite hands out ``max(rowid) + 1``, so deleting the newest events would
  otherwise let later events reuse notification ids that feed cursors have already passed.

If anything a prune decided on changes before it commits (a concurrent write to a candidate, a
new grant, another prune), the prune starts over.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eventsourcing.domain import DomainEvent
from eventsourcing.persistence import IntegrityError

from procledger.adapters.store import Store, Tx
from procledger.domain.errors import StoreError
from procledger.domain.process import process_uuid, timestamp_of
from procledger.domain.session import Session
from procledger.projections.filters import ProcessListFilter
from procledger.projections.grants import apply_session_event
from procledger.projections.records import advance_tracking
from procledger.projections.reports import PruneReport

if TYPE_CHECKING:
    from procledger.registry import ProcessRegistry

RETENTION_ID = uuid.UUID("3c5f0d8e-2b4a-4f61-9e07-5a1d6c8b9f42")
_ATTEMPTS = 50
_CHUNK = 500


@dataclass(frozen=True)
class RetentionPruned(DomainEvent):
    """A prune happened: the retention log's only kind of event (never loaded as state)."""

    TOPIC = "procledger:Retention.Pruned"
    at_ms: int
    cutoff_ms: int
    up_to: int | None
    process_count: int


class _Changed(Exception):
    """What the prune decided on changed before it could commit: start over."""


def prune_filter(filter: ProcessListFilter | Any | None) -> ProcessListFilter:
    """The filter a prune applies: any status unless the caller named one."""
    if filter is None:
        return ProcessListFilter(status="any")
    decoded = ProcessListFilter.decode(filter)
    if "status" not in decoded.model_fields_set:
        return decoded.model_copy(update={"status": "any"})
    return decoded


def prune_terminal(
    registry: ProcessRegistry, cutoff_ms: int, selection: ProcessListFilter, up_to: int | None
) -> PruneReport:
    store = registry.store
    for _ in range(_ATTEMPTS):
        with store.read() as tx:
            candidates = _candidates(tx, store, cutoff_ms, selection, up_to)
            if not candidates:
                return PruneReport()
            grants = _grants_of(tx, store, list(candidates))
            version = _retention_version(tx, store)
        now = registry.now_ms()
        sessions = _revoke(registry, grants, now)
        marker = RetentionPruned(
            originator_id=RETENTION_ID,
            originator_version=version + 1,
            timestamp=timestamp_of(now),
            at_ms=now,
            cutoff_ms=cutoff_ms,
            up_to=up_to,
            process_count=len(candidates),
        )
        unit = _PruneUnit(store, candidates, grants, sessions)
        stored = [
            registry.mapper.to_stored_event(event) for _, events in sessions for event in events
        ]
        stored.append(registry.mapper.to_stored_event(marker))
        try:
            registry.recorder.insert_events(stored, unit=unit)
        except (IntegrityError, _Changed):
            continue
        registry._notify_changed()
        return PruneReport(processes=sorted(candidates), events=unit.deleted_events)
    raise StoreError(f"prune_terminal: gave up after {_ATTEMPTS} conflicting attempts")


def _candidates(
    tx: Tx, store: Store, cutoff_ms: int, selection: ProcessListFilter, up_to: int | None
) -> dict[str, int]:
    """``process_id -> change_seq`` of what to prune."""
    where, params = selection.sql()
    statement = (
        f"SELECT process_id, change_seq FROM {store.table('records')} "
        f"WHERE terminal=1 AND updated_at_ms<? AND {where}"
    )
    arguments: list[object] = [cutoff_ms, *params]
    if up_to is not None:
        statement += " AND change_seq<=?"
        arguments.append(up_to)
    return {
        row["process_id"]: int(row["change_seq"]) for row in tx.execute(statement, arguments).all()
    }


def _grants_of(tx: Tx, store: Store, process_ids: list[str]) -> set[tuple[str, str]]:
    """``(session_id, process_id)`` grants on these processes."""
    found: set[tuple[str, str]] = set()
    for start in range(0, len(process_ids), _CHUNK):
        chunk = process_ids[start : start + _CHUNK]
        marks = ",".join("?" * len(chunk))
        rows = tx.execute(
            f"SELECT session_id, process_id FROM {store.table('grants')} "
            f"WHERE process_id IN ({marks})",
            chunk,
        ).all()
        found.update((row["session_id"], row["process_id"]) for row in rows)
    return found


def _retention_version(tx: Tx, store: Store) -> int:
    originator = RETENTION_ID.hex if store.dialect == "sqlite" else RETENTION_ID
    row = tx.execute(
        f"SELECT MAX(originator_version) AS v FROM {store.events_table} WHERE originator_id=?",
        (originator,),
    ).one()
    return int(row["v"] or 0)


def _revoke(
    registry: ProcessRegistry, grants: set[tuple[str, str]], now: int
) -> list[tuple[Session, list[Any]]]:
    by_session: dict[str, list[str]] = {}
    for session_id, process_id in sorted(grants):
        by_session.setdefault(session_id, []).append(process_id)
    sessions: list[tuple[Session, list[Any]]] = []
    for session_id, process_ids in by_session.items():
        session = registry._load_session(session_id)
        if session is None:
            raise _Changed
        for process_id in process_ids:
            session.revoke(process_id, at_ms=now)
        sessions.append((session, list(session.collect_events())))
    return sessions


class _PruneUnit:
    """The deletions, checked and done under the write lock, after the events are appended."""

    def __init__(
        self,
        store: Store,
        candidates: dict[str, int],
        grants: set[tuple[str, str]],
        sessions: Sequence[tuple[Session, list[Any]]],
    ) -> None:
        self.store = store
        self.candidates = candidates
        self.grants = grants
        self.sessions = sessions
        self.deleted_events = 0

    def before(self, tx: Tx) -> None:
        """Nothing: the deletions wait until the new events hold the log's high-water mark."""

    def after(self, tx: Tx, notification_ids: Sequence[int]) -> None:
        ids = list(self.candidates)
        if _grants_of(tx, self.store, ids) != self.grants:
            raise _Changed
        for process_id, change_seq in self.candidates.items():
            if not self._delete(tx, process_id, change_seq):
                raise _Changed
        for session, events in self.sessions:
            for event in events:
                apply_session_event(tx, self.store, session.session_id, event)
        advance_tracking(tx, self.store, max(notification_ids, default=0))

    def _delete(self, tx: Tx, process_id: str, change_seq: int) -> bool:
        t = self.store.table
        tx.execute(
            f"DELETE FROM {t('records')} WHERE process_id=? AND change_seq=? AND terminal=1",
            (process_id, change_seq),
        )
        if tx.rowcount != 1:
            return False
        originator = process_uuid(process_id)
        tx.execute(
            f"DELETE FROM {self.store.events_table} WHERE originator_id=?",
            (originator.hex if self.store.dialect == "sqlite" else originator,),
        )
        self.deleted_events += tx.rowcount
        tx.execute(
            f"DELETE FROM {t('journal')} WHERE process_handle IN "
            f"(SELECT handle FROM {t('handles')} WHERE process_id=?)",
            (process_id,),
        )
        tx.execute(f"DELETE FROM {t('handles')} WHERE process_id=?", (process_id,))
        tx.execute(f"DELETE FROM {t('leases')} WHERE process_id=?", (process_id,))
        return True
