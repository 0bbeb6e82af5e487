"""Reading the read models: the change feed, process lists and handle summaries.

The read models are maintained in the same transaction as each event append (with the tracking
position), so every read here already reflects every committed write: there is nothing to
catch up on. ``rebuild`` recomputes them from the log alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from procledger.adapters.sql import record_rows
from procledger.adapters.sql.store import Store
from procledger.domain.errors import AmbiguousProcessId, NotFound, StoreCorrupt
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

PREFIX_CANDIDATES = 5
"""How many ids an ambiguous prefix lists (enough to choose from, short enough for a line)."""
SERVICE_ATTEMPTS = 10_000
"""A prefix resolves to a service whose attempts number at most this many."""

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
        """The one process id ``prefix`` names: itself when it is an id, else the only id
        that starts with it."""
        if not prefix:
            raise NotFound("an empty process id prefix names no process")
        found = self.store.attempt(
            lambda tx: record_rows.ids_from(tx, prefix, PREFIX_CANDIDATES + 1)
        )
        if prefix in found:
            return prefix
        if not found:
            raise NotFound(f"process {prefix!r} not found (no id starts with it)")
        if len(found) > 1:
            service = self._one_service(prefix, found[0])
            if service is None:
                more = len(found) > PREFIX_CANDIDATES
                raise AmbiguousProcessId(prefix, found[:PREFIX_CANDIDATES], more=more)
            return service
        return found[0]

    def _one_service(self, prefix: str, first: str) -> str | None:
        """``first`` when every id starting with ``prefix`` is an attempt of the service
        ``first`` is the first attempt of (``<first>.<n>``, docs/design.md §15.4): a prefix of a
        service names the service, not one of its attempts."""
        try:
            if self.record(first).attempt != 1:
                return None
        except NotFound:
            return None
        found = self.store.attempt(
            lambda tx: record_rows.ids_from(tx, prefix, SERVICE_ATTEMPTS + 1)
        )
        if len(found) > SERVICE_ATTEMPTS:
            return None
        later = f"{first}."
        if all(i == first or (i.startswith(later) and i[len(later) :].isdigit()) for i in found):
            return first
        return None

    def handle(self, session_id: str, process_id: str) -> HandleSummary:
        return self.store.attempt(lambda tx: read_handle(tx, session_id, process_id))

    def handles(self, session_id: str, filter: FilterLike = None) -> list[HandleSummary]:
        selection = ProcessListFilter.decode(filter)
        summaries, damaged = self.store.attempt(lambda tx: read_handles(tx, session_id, selection))
        report_damaged(f"handles of session {session_id!r}", damaged)
        return summaries

    def handle_sessions(self, process_id: str) -> list[str]:
        return self.store.attempt(lambda tx: read_handle_sessions(tx, process_id))
