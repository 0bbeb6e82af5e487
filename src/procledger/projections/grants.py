"""The ``grants`` read model: which session holds a handle to which process, folded from
``Session`` events in the same transaction as their append."""

from __future__ import annotations

from typing import Any

import orjson

from procledger.adapters.sql import grant_rows
from procledger.adapters.sql.store import Tx
from procledger.domain.session import Session


def apply_session_event(tx: Tx, session_id: str, event: Any) -> None:
    """Fold one session event into the grants table (idempotent per row)."""
    if isinstance(event, Session.Granted):
        descriptor = None if event.descriptor is None else orjson.dumps(event.descriptor).decode()
        grant_rows.upsert(tx, session_id, event.process_id, descriptor)
    elif isinstance(event, Session.Revoked):
        grant_rows.delete(tx, session_id, event.process_id)
