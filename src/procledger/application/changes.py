"""What a follower of the change feed needs below the application layer, named here.

The async follower (``procledger.aio.follow``, docs/design.md §17) moves by the feed's cursors
and is woken by a listener for other processes' commits. Both live below this layer (the
cursor in ``projections``, the listener in ``adapters/sql``); the async API, like the
supervisor and the web view, reaches the store and the read models only through the
application layer (§1.2): these names from here, the listener itself from
``ProcessRegistry.open_change_listener``.
"""

from __future__ import annotations

from procledger.adapters.sql.listen import ChangeListener
from procledger.projections.feed import ChangeCursor

__all__ = ["ChangeCursor", "ChangeListener"]
