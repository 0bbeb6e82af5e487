"""Retention: delete old terminal processes with everything that refers to them.

One prune is one transaction (appended events and deletions commit together):

- the candidates are the terminal records with ``updated_at_ms < cutoff_ms`` (and
  ``change_seq <= up_to``) matching the filter — never a non-terminal process;
- their events leave the log, their ``records``, ``leases``, ``heads`` and ``handles`` rows
  and the journal entries of those handles go, and so do the ``envs`` rows of their
  environments unless a process still in the ledger names the same env ref;
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
from typing import Any, Protocol

from eventsourcing.domain import DomainEvent

from procledger.adapters.sql import (
    env_rows,
    event_rows,
    grant_rows,
    handle_rows,
    head_rows,
    journal_rows,
    lease_rows,
    record_rows,
)
from procledger.adapters.sql.store import Tx
from procledger.application.retry import retry_on_conflict
from procledger.application.unit_of_work import Ledger
from procledger.domain.errors import WriteConflict
from procledger.domain.process import process_uuid, timestamp_of
from procledger.domain.records import ProcessRecord
from procledger.domain.session import Session
from procledger.projections.filters import ProcessListFilter
from procledger.projections.grants import apply_session_event
from procledger.projections.reports import PruneReport

RETENTION_ID = uuid.UUID("3c5f0d8e-2b4a-4f61-9e07-5a1d6c8b9f42")


@dataclass(frozen=True)
class RetentionPruned(DomainEvent):
    """A prune happened: the retention log's only kind of event (never loaded as state)."""

    TOPIC = "procledger:Retention.Pruned"
    class_version = 1
    at_ms: int
    cutoff_ms: int
    up_to: int | None
    process_count: int


class Changed(WriteConflict):
    """What the prune decided on changed before it could commit: start over."""


def prunes_so_far(tx: Tx) -> int:
    """How many prunes the ledger has recorded (its retention stream's version): one indexed
    read, so a reader that keeps records it has seen knows when to look again for ones that
    are gone (``PrunedSince``)."""
    return event_rows.max_version(tx, RETENTION_ID)


class _Ledger(Protocol):
    def prunes_so_far(self) -> int: ...
    def change_seqs(self, process_ids: Sequence[str]) -> dict[str, int]: ...


class PrunedSince:
    """Which of the records a reader keeps (the metrics' summaries, the web's counts) the
    ledger has pruned since it last looked. A prune writes nothing to the change feed, so each
    look reads how many prunes there have been (one indexed read) and, only when that grew,
    which of the ids are still held (in batches, one transaction). Not thread-safe: one
    reader's."""

    def __init__(self, registry: _Ledger, prunes: int = 0) -> None:
        self._registry = registry
        self.prunes = prunes  # the prunes the last look had seen

    def look_again_from(self, prunes: int) -> None:
        """Count prunes from ``prunes`` on again: records read meanwhile may be gone too."""
        self.prunes = min(self.prunes, prunes)

    def gone(self, ids: Sequence[str]) -> list[str]:
        """Those of ``ids`` pruned since the last look (none without a new prune)."""
        prunes = self._registry.prunes_so_far()
        if prunes == self.prunes:
            return []
        held = self._registry.change_seqs(ids)
        self.prunes = prunes
        return [process_id for process_id in ids if process_id not in held]


def prune_filter(filter: ProcessListFilter | Any | None) -> ProcessListFilter:
    """The filter a prune applies: any status unless the caller named one."""
    if filter is None:
        return ProcessListFilter(status="any")
    decoded = ProcessListFilter.decode(filter)
    if "status" not in decoded.model_fields_set:
        return decoded.model_copy(update={"status": "any"})
    return decoded


def prunable(record: ProcessRecord, cutoff_ms: int) -> bool:
    """Whether a prune with ``cutoff_ms`` deletes ``record``, one its filter selects: the test
    ``record_rows.prunable`` makes in SQL, for a preview (``procledger prune --dry-run``)."""
    return record.is_terminal and record.updated_at_ms < cutoff_ms


def prune_terminal(
    ledger: Ledger, cutoff_ms: int, selection: ProcessListFilter, up_to: int | None
) -> PruneReport:
    """Delete the matching terminal processes with everything they own (one transaction).

    Raises:
        StoreError: the prune kept meeting concurrent changes.
    """
    return retry_on_conflict(
        lambda: _prune_once(ledger, cutoff_ms, selection, up_to), "prune_terminal"
    )


def _prune_once(
    ledger: Ledger, cutoff_ms: int, selection: ProcessListFilter, up_to: int | None
) -> PruneReport:
    found = ledger.store.attempt(lambda tx: _prune_candidates(tx, cutoff_ms, selection, up_to))
    if found is None:
        return PruneReport()
    candidates, grants, version = found
    now = ledger.now_ms()
    sessions = _revoke(ledger, grants, now)
    marker = RetentionPruned(
        originator_id=RETENTION_ID,
        originator_version=version + 1,
        timestamp=timestamp_of(now),
        at_ms=now,
        cutoff_ms=cutoff_ms,
        up_to=up_to,
        process_count=len(candidates),
    )
    unit = PruneUnit(candidates, grants, sessions)
    to_stored = ledger.mapper.to_stored_event
    stored = [to_stored(event) for _, events in sessions for event in events]
    stored.append(to_stored(marker))
    ledger.append(stored, unit)
    return PruneReport(processes=sorted(candidates), events=unit.deleted_events)


def _prune_candidates(
    tx: Tx, cutoff_ms: int, selection: ProcessListFilter, up_to: int | None
) -> tuple[dict[str, int], set[tuple[str, str]], int] | None:
    """What a prune would delete, the grants on it and the retention stream's version, read
    in one transaction (``Store.attempt`` re-runs it if the connection is lost); ``None``:
    nothing to prune."""
    candidates = record_rows.prunable(tx, cutoff_ms, selection.conditions(), up_to)
    if not candidates:
        return None
    grants = grant_rows.grants_on(tx, list(candidates))
    return candidates, grants, event_rows.max_version(tx, RETENTION_ID)


def _revoke(
    ledger: Ledger, grants: set[tuple[str, str]], now: int
) -> list[tuple[Session, list[Any]]]:
    by_session: dict[str, list[str]] = {}
    for session_id, process_id in sorted(grants):
        by_session.setdefault(session_id, []).append(process_id)
    sessions: list[tuple[Session, list[Any]]] = []
    for session_id, process_ids in by_session.items():
        session = ledger.load_session(session_id)
        if session is None:
            raise Changed(f"session {session_id!r} changed during a prune")
        for process_id in process_ids:
            session.revoke(process_id, at_ms=now)
        sessions.append((session, list(session.collect_events())))
    return sessions


class PruneUnit:
    """The deletions, checked and done under the write lock, after the events are appended."""

    def __init__(
        self,
        candidates: dict[str, int],
        grants: set[tuple[str, str]],
        sessions: Sequence[tuple[Session, list[Any]]],
    ) -> None:
        self.candidates = candidates
        self.grants = grants
        self.sessions = sessions
        self.deleted_events = 0

    def before(self, tx: Tx) -> None:
        """Nothing: the deletions wait until the new events hold the log's high-water mark."""

    def after(self, tx: Tx, notification_ids: Sequence[int]) -> None:
        if grant_rows.grants_on(tx, list(self.candidates)) != self.grants:
            raise Changed("grants changed during a prune")
        env_refs = env_rows.referenced_by(tx, self.candidates)
        for process_id, change_seq in self.candidates.items():
            if not self._delete(tx, process_id, change_seq):
                raise Changed(f"process {process_id!r} changed during a prune")
        env_rows.delete_unreferenced(tx, env_refs)
        for session, events in self.sessions:
            for event in events:
                apply_session_event(tx, session.session_id, event)
        record_rows.advance_tracking(tx, max(notification_ids, default=0))

    def _delete(self, tx: Tx, process_id: str, change_seq: int) -> bool:
        if not record_rows.delete_terminal(tx, process_id, change_seq):
            return False
        self.deleted_events += event_rows.delete_aggregate(tx, process_uuid(process_id))
        journal_rows.delete_for_process(tx, process_id)
        handle_rows.delete_for_process(tx, process_id)
        lease_rows.delete(tx, process_id)
        head_rows.delete(tx, process_id)
        return True
