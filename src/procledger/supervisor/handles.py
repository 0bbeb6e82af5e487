"""Process handles and the ``handles`` side table.

A handle is what ``Supervisor.start`` gives its caller and what a completion notification names:
16 random bytes, URL-safe base64 without padding (22 characters). It encodes nothing (no pid,
path, owner or time). The table maps it to its process, the owner that started it and where
its completion notification goes, so that ``restore`` — in another OS process, after a crash —
can publish that notification with the same handle and command id.

The table is not an event stream: a handle is an address, not a fact about the process.
"""

from __future__ import annotations

import base64
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from procledger.adapters.sql import handles as handle_sql
from procledger.adapters.sql.store import Tx

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

HANDLE_BYTES: Final = 16


def new_handle() -> str:
    """16 random bytes as URL-safe base64 without padding: 22 characters of [A-Za-z0-9_-]."""
    return base64.urlsafe_b64encode(secrets.token_bytes(HANDLE_BYTES)).rstrip(b"=").decode()


def new_process_id(now_ms: int) -> str:
    """A fresh process id for a caller that names none: the time first (11 hex digits of
    milliseconds), so ids sort by creation, then 8 random hex digits, so two processes
    registered in the same millisecond do not collide."""
    return f"{now_ms:011x}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class HandleRow:
    handle: str
    process_id: str
    owner_id: str
    session_id: uuid.UUID | None
    loop_id: uuid.UUID | None
    command_id: uuid.UUID


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


def save_handle(registry: ProcessRegistry, row: HandleRow) -> None:
    """Insert the row, or update where its notification goes (a retried ``start``).

    An upsert of the same values, so a transaction lost mid-way (a PostgreSQL restart) just
    runs again through ``Store.attempt`` (docs/design.md §7.3)."""

    def upsert(tx: Tx) -> None:
        handle_sql.upsert_handle(
            tx,
            handle=row.handle,
            process_id=row.process_id,
            owner_id=row.owner_id,
            session_id=None if row.session_id is None else str(row.session_id),
            loop_id=None if row.loop_id is None else str(row.loop_id),
            command_id=str(row.command_id),
        )

    registry.store.attempt(upsert, write=True)


def handle_for_process(registry: ProcessRegistry, process_id: str) -> HandleRow | None:
    """The process's handle (the first minted, if a retried start minted more)."""
    row = registry.store.attempt(lambda tx: handle_sql.first_handle_row(tx, process_id))
    return None if row is None else _row(row)


def change_seqs(registry: ProcessRegistry, process_ids: Sequence[str]) -> dict[str, int]:
    """The change-feed position of each process's record: one read for a whole batch, so a
    supervisor can notice stop requests made elsewhere without decoding every record."""
    if not process_ids:
        return {}
    return registry.store.attempt(lambda tx: handle_sql.change_seqs(tx, process_ids))
