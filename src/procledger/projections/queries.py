"""Reading the read models: the change feed, process lists and handle summaries.

The read models are maintained in the same transaction as each event append (with the tracking
position), so every read here already reflects every committed write: there is nothing to
catch up on. ``rebuild`` recomputes them from the log alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from procledger.adapters.sql import service_rows
from procledger.adapters.sql.record_rows import matching_ids
from procledger.adapters.sql.store import Store
from procledger.domain import id_prefix
from procledger.domain.errors import NotFound, StoreCorrupt
from procledger.domain.records import ProcessRecord
from procledger.projections.feed import ChangeCursor, FeedPage, read_page
from procledger.projections.filters import ProcessListFilter
from procledger.projections.handles import HandleSummary
from procledger.projections.records import (
    EVERYTHING,
    Page,
    ProcessScan,
    read_record,
    report_damaged,
    report_unreadable,
    salvage_records,
    scan_records,
)
from procledger.projections.sessions import read_handle, read_handle_sessions, read_handles

FilterLike = ProcessListFilter | Mapping[str, Any] | None


class ReadModels:
    """The queries over one store's read models. Each runs in one read transaction, run again
    while the store is unavailable within its retry window (``Store.attempt``). A damaged
    record affects its own process only: lists and pages leave it out and name it."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def record(self, process_id: str) -> ProcessRecord:
        record = self.store.attempt(lambda tx: read_record(tx, process_id))
        if record is None:
            raise NotFound(f"process {process_id!r} not found")
        return record

    def scan_changes(self, cursor: ChangeCursor | int, limit: int) -> FeedPage:
        start = ChangeCursor.of(cursor)
        return self.store.attempt(lambda tx: read_page(tx, start, limit))

    def changes_since(
        self, cursor: ChangeCursor | int, limit: int
    ) -> tuple[list[ProcessRecord], ChangeCursor]:
        records, after, damaged = self.scan_changes(cursor, limit)
        report_damaged("changes_since", damaged)
        return records, after

    def scan_processes(self, filter: FilterLike = None, page: Page = EVERYTHING) -> ProcessScan:
        """The page of matching records; in a damaged SQLite file, whatever of it can still
        be read (and a warning saying what could not: docs/design.md §7.3)."""
        conditions = ProcessListFilter.decode(filter).conditions()
        try:
            return self.store.attempt(lambda tx: scan_records(tx, conditions, page))
        except StoreCorrupt as error:
            if error.file is None:
                raise
            damaged = error.file
        scan, unreadable = self.store.attempt(lambda tx: salvage_records(tx, conditions, page))
        report_unreadable(damaged, unreadable)
        return scan

    def list_processes(
        self, filter: FilterLike = None, page: Page = EVERYTHING
    ) -> list[ProcessRecord]:
        records, damaged = self.scan_processes(filter, page)
        report_damaged("list_processes", damaged)
        return records

    def resolve_process_id(self, prefix: str) -> str:
        """The one process id ``prefix`` names (``id_prefix.resolve``)."""
        return id_prefix.resolve(prefix, self._matching, self._is_first_attempt, self._named)

    def _matching(self, prefix: str, limit: int) -> list[str]:
        return self.store.attempt(lambda tx: matching_ids(tx, prefix, limit))

    def _named(self, name: str) -> str | None:
        return self.store.attempt(lambda tx: service_rows.held_name(tx, name))

    def _is_first_attempt(self, process_id: str) -> bool:
        try:
            return self.record(process_id).attempt == 1
        except NotFound:
            return False

    def handle(self, session_id: str, process_id: str) -> HandleSummary:
        return self.store.attempt(lambda tx: read_handle(tx, session_id, process_id))

    def handles(self, session_id: str, filter: FilterLike = None) -> list[HandleSummary]:
        selection = ProcessListFilter.decode(filter)
        summaries, damaged = self.store.attempt(lambda tx: read_handles(tx, session_id, selection))
        report_damaged(f"handles of session {session_id!r}", damaged)
        return summaries

    def handle_sessions(self, process_id: str) -> list[str]:
        return self.store.attempt(lambda tx: read_handle_sessions(tx, process_id))
