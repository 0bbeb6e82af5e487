"""Being told of commits by other processes (docs/design.md §17): a LISTEN connection on
PostgreSQL; SQLite has no such channel, so its followers poll (and are woken by their own
process's writes through the registry's change signal)."""

from __future__ import annotations

from typing import Protocol

from procledger.adapters.sql.store import Store


class ChangeListener(Protocol):
    """A descriptor that becomes readable when another connection committed an append."""

    def fileno(self) -> int: ...

    def drain(self) -> bool: ...

    def close(self) -> None: ...


def change_listener(store: Store) -> ChangeListener | None:
    """A listener for ``store``'s appends, or ``None`` where the store has no channel."""
    if store.postgres is None or store.change_channel is None:
        return None
    from procledger.adapters.sql.postgres import PostgresListener

    return PostgresListener(store.location, store.change_channel)
