"""What a follower of the change feed needs below the application layer, named here.

The async follower (``procledger.aio.follow``, docs/design.md §17) moves by the feed's cursors
and is woken by a listener for other processes' commits. Both live below this layer (the
cursor in ``projections``, the listener in ``adapters/sql``); the async API, like the
supervisor and the web view, reaches the store and the read models only through the
application layer (§1.2), so this module is the one door it uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from procledger.adapters.sql.listen import ChangeListener, change_listener
from procledger.projections.feed import ChangeCursor

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = ["ChangeCursor", "ChangeListener", "open_change_listener"]


def open_change_listener(registry: ProcessRegistry) -> ChangeListener | None:
    """A connection of its own, told of every commit by other processes to ``registry``'s
    store (PostgreSQL's LISTEN), or ``None`` where the store has no such channel (SQLite and
    memory: their followers poll, and the registry's change signal tells of its own writes).
    The caller closes it.

    Raises:
        StoreError: the listening connection could not be opened.
    """
    return change_listener(registry.store)
