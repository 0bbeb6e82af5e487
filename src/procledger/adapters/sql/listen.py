"""Being told of commits by other processes (docs/design.md §17): a LISTEN connection on
PostgreSQL; SQLite has no such channel, so its followers poll (and are woken by their own
process's writes through the registry's change signal)."""

from __future__ import annotations

from procledger.adapters.sql.store import ChangeListener, Store

__all__ = ["ChangeListener", "change_listener"]


def change_listener(store: Store) -> ChangeListener | None:
    """A listener for ``store``'s appends, or ``None`` where the store has no channel."""
    return store.backend.change_listener()
