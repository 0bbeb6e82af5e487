"""What ``delete_session`` and ``prune_terminal`` did (lists are sorted)."""

from __future__ import annotations

from pydantic import Field

from procledger.domain.model import Frozen


class SessionDeleteReport(Frozen):
    session_id: str
    revoked_handle_count: int
    """Grants the session held, now revoked."""
    deleted_wake_count: int
    """Processes whose wake target pointed at the session (any agent frame of it), cleared."""
    orphaned_process_ids: list[str] = Field(default_factory=list)
    """Non-terminal processes that only this session held a handle to."""
    preserved_process_ids: list[str] = Field(default_factory=list)
    """Non-terminal processes that another session still holds a handle to."""


class PruneReport(Frozen):
    processes: list[str] = Field(default_factory=list)
    """The ids of the pruned processes."""
    events: int = 0
    """How many of their events were deleted from the log."""


class RebuildReport(Frozen):
    """What ``rebuild`` did: the events it read, and what it could not rebuild."""

    applied: int = 0
    """How many events were read from the log."""
    damaged: list[str] = Field(default_factory=list)
    """The processes (or sessions) that were not rebuilt, by id — or ``"stream <uuid>"`` when
    even the first event is unreadable: their log does not verify (``marked``), or their
    events cannot be decoded or applied. Everything else was rebuilt."""
    marked: list[str] = Field(default_factory=list)
    """The processes among ``damaged`` whose hash chain does not verify: their ``records``
    row now says so instead of holding a record (docs/design.md §13.5). The other damaged
    ones kept their rows as they were."""
