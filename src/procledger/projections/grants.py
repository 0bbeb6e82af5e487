"""The ``grants`` read model: which session holds a handle to which process."""

from __future__ import annotations

from typing import Any

import orjson

from procledger.adapters.store import Store, Tx
from procledger.domain.session import Session


def apply_session_event(tx: Tx, store: Store, session_id: str, event: Any) -> None:
    """Fold one session event into the grants table (idempotent per row)."""
    if isinstance(event, Session.Granted):
        descriptor = None if event.descriptor is None else orjson.dumps(event.descriptor).decode()
        tx.execute(
            f"INSERT INTO {store.table('grants')} (session_id, process_id, descriptor) "
            "VALUES (?,?,?) ON CONFLICT (session_id, process_id) "
            "DO UPDATE SET descriptor=excluded.descriptor",
            (session_id, event.process_id, descriptor),
        )
    elif isinstance(event, Session.Revoked):
        tx.execute(
            f"DELETE FROM {store.table('grants')} WHERE session_id=? AND process_id=?",
            (session_id, event.process_id),
        )
