"""The ``handles`` side table as the Supervisor and ``restore`` use it (docs/design.md §6.2):
where a started process's completion notification goes, kept so that ``restore`` -- in another
OS process, after a crash -- publishes that notification with the same handle and command id.

The table is not an event stream: a handle is an address, not a fact about the process.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from procledger.adapters.sql import handle_rows
from procledger.adapters.sql.store import Store, Tx

__all__ = ["HandleRow", "change_seqs", "first_handle_row", "save_handle_row"]


@dataclass(frozen=True, slots=True)
class HandleRow:
    """One started process's handle and where its completion notification goes."""

    handle: str
    process_id: str
    owner_id: str
    session_id: uuid.UUID | None
    loop_id: uuid.UUID | None
    command_id: uuid.UUID


def save_handle_row(store: Store, row: HandleRow) -> None:
    """Insert the row, or update where its notification goes (a retried ``start``).

    An upsert of the same values, so a transaction lost mid-way (a PostgreSQL restart) just
    runs again through ``Store.attempt`` (docs/design.md §7.3)."""

    def upsert(tx: Tx) -> None:
        handle_rows.upsert_handle(
            tx,
            handle=row.handle,
            process_id=row.process_id,
            owner_id=row.owner_id,
            session_id=_text(row.session_id),
            loop_id=_text(row.loop_id),
            command_id=str(row.command_id),
        )

    store.attempt(upsert, write=True)


def first_handle_row(store: Store, process_id: str) -> HandleRow | None:
    """The process's handle row (the first minted, if a retried start minted more)."""
    row = store.attempt(lambda tx: handle_rows.first_handle_row(tx, process_id))
    return None if row is None else _row(row)


def change_seqs(store: Store, process_ids: Sequence[str]) -> dict[str, int]:
    """The change-feed position of each process's record: one read for a whole batch."""
    if not process_ids:
        return {}
    return store.attempt(lambda tx: handle_rows.change_seqs(tx, process_ids))


def latest_change_seq(store: Store) -> int:
    """The newest change-feed position of any record: whether anything changed at all."""
    return store.attempt(handle_rows.latest_change_seq)


def _row(row: Any) -> HandleRow:
    return HandleRow(
        handle=row["handle"],
        process_id=row["process_id"],
        owner_id=row["owner_id"],
        session_id=_uuid(row["session_id"]),
        loop_id=_uuid(row["loop_id"]),
        command_id=uuid.UUID(row["command_id"]),
    )


def _uuid(value: str | None) -> uuid.UUID | None:
    return None if value is None else uuid.UUID(value)


def _text(value: uuid.UUID | None) -> str | None:
    return None if value is None else str(value)
