"""Reading the read models: the change feed, process lists and handle summaries.

The read models are maintained in the same transaction as each event append (with the tracking
position), so every read here already reflects every committed write: there is nothing to
catch up on. ``rebuild`` recomputes them from the log alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from procledger.adapters.sql.store import Store
from procledger.domain.errors import NotFound
from procledger.domain.records import ProcessRecord
from procledger.projections.feed import ChangeCursor, read_page
from procledger.projections.filters import ProcessListFilter
from procledger.projections.handles import HandleSummary
from procledger.projections.records import read_record, read_records
from procledger.projections.sessions import read_handle, read_handle_sessions, read_handles

FilterLike = ProcessListFilter | Mapping[str, Any] | None


class ReadModels:
    """The queries over one store's read models."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def record(self, process_id: str) -> ProcessRecord:
        with self.store.read() as tx:
            record = read_record(tx, process_id)
        if record is None:
            raise NotFound(f"process {process_id!r} not found")
        return record

    def changes_since(
        self, cursor: ChangeCursor | int, limit: int
    ) -> tuple[list[ProcessRecord], ChangeCursor]:
        with self.store.read() as tx:
            return read_page(tx, ChangeCursor.of(cursor), limit)

    def list_processes(self, filter: FilterLike = None) -> list[ProcessRecord]:
        selection = ProcessListFilter.decode(filter)
        with self.store.read() as tx:
            return read_records(tx, selection.conditions())

    def handle(self, session_id: str, process_id: str) -> HandleSummary:
        with self.store.read() as tx:
            return read_handle(tx, session_id, process_id)

    def handles(self, session_id: str, filter: FilterLike = None) -> list[HandleSummary]:
        selection = ProcessListFilter.decode(filter)
        with self.store.read() as tx:
            return read_handles(tx, session_id, selection)

    def handle_sessions(self, process_id: str) -> list[str]:
        with self.store.read() as tx:
            return read_handle_sessions(tx, process_id)
