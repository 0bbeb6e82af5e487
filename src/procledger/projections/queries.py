"""Projection queries of the registry (DESIGN.md §5): change feed, lists, handles, session
deletion, pruning and rebuild.

The read models are maintained by the registry in the same transaction as each event append
(with the tracking position), so every read here already reflects every committed write: there
is nothing to catch up on. ``rebuild`` recomputes them from the log alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from procledger.domain.records import ProcessRecord
from procledger.projections.feed import ChangeCursor, by_code_point, read_page
from procledger.projections.filters import ProcessListFilter
from procledger.projections.handles import HandleSummary
from procledger.projections.pruning import prune_filter, prune_terminal
from procledger.projections.rebuild import rebuild_read_models
from procledger.projections.records import read_records
from procledger.projections.reports import PruneReport, SessionDeleteReport
from procledger.projections.sessions import (
    delete_session,
    read_handle,
    read_handle_sessions,
    read_handles,
)

if TYPE_CHECKING:
    from procledger.registry import ProcessRegistry

FilterLike = ProcessListFilter | Mapping[str, Any] | None


class ProjectionQueries:
    """Mixed into ``ProcessRegistry``."""

    def _registry(self) -> ProcessRegistry:
        return cast("ProcessRegistry", self)

    # -- change feed -------------------------------------------------------------------------

    def changes_since(
        self, cursor: ChangeCursor | int, limit: int
    ) -> tuple[list[ProcessRecord], ChangeCursor]:
        """Records changed after ``cursor``, in ``(change_seq, id)`` order, at most ``limit``,
        each once at its latest state; the cursor of the last one (``cursor`` if none)."""
        store = self._registry().store
        with store.read() as tx:
            return read_page(tx, store, ChangeCursor.of(cursor), limit)

    # -- listing -----------------------------------------------------------------------------

    def list_processes(self, filter: FilterLike = None) -> list[ProcessRecord]:
        """Processes matching ``filter`` (default: running), sorted by id."""
        selection = ProcessListFilter.decode(filter)
        where, params = selection.sql()
        store = self._registry().store
        with store.read() as tx:
            return read_records(
                tx, store, f"WHERE {where} ORDER BY process_id{by_code_point(store)}", params
            )

    # -- handles -----------------------------------------------------------------------------

    def handle(self, session_id: str, process_id: str) -> HandleSummary:
        """The session's handle to a process; ``NotFound`` alike for ungranted and unknown."""
        store = self._registry().store
        with store.read() as tx:
            return read_handle(tx, store, session_id, process_id)

    def handles(self, session_id: str, filter: FilterLike = None) -> list[HandleSummary]:
        """The session's handles whose processes match ``filter`` (default: running), by id."""
        selection = ProcessListFilter.decode(filter)
        store = self._registry().store
        with store.read() as tx:
            return read_handles(tx, store, session_id, selection)

    def handle_sessions(self, process_id: str) -> list[str]:
        """The sessions holding a handle to the process, sorted; ``NotFound`` if unknown."""
        store = self._registry().store
        with store.read() as tx:
            return read_handle_sessions(tx, store, process_id)

    def delete_session(self, session_id: str) -> SessionDeleteReport:
        """Revoke the session's grants and clear wake targets pointing at it (one write)."""
        return delete_session(self._registry(), session_id)

    # -- retention and rebuild ---------------------------------------------------------------

    def prune_terminal(
        self,
        cutoff_ms: int,
        filter: FilterLike = None,
        up_to: ChangeCursor | int | None = None,
    ) -> PruneReport:
        """Delete terminal processes last updated before ``cutoff_ms`` (and changed at or
        before ``up_to``) that match ``filter`` (default: any status), with their events,
        grants, leases, handles and journal entries."""
        if isinstance(cutoff_ms, bool) or not isinstance(cutoff_ms, int):
            raise TypeError(f"cutoff_ms must be an int (epoch ms), not {cutoff_ms!r}")
        watermark = None if up_to is None else ChangeCursor.of(up_to).value
        return prune_terminal(self._registry(), cutoff_ms, prune_filter(filter), watermark)

    def rebuild(self, progress: Callable[[int, int], None] | None = None) -> int:
        """Drop every read model and rebuild it from the log; returns the events applied.
        ``progress(done, total)`` is called as batches commit to the transaction."""
        registry = self._registry()
        lock = list(getattr(registry.recorder, "lock_table_statements", []))
        applied = rebuild_read_models(registry.store, lock, progress)
        registry._notify_changed()
        return applied
