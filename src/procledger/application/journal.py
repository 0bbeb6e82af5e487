"""The notification journal of one ledger: completion notifications stored as commands before
they are dispatched, unique by command id (see ``procledger.notifications.journal``).

In one write transaction the stored payload is read first: found, the bytes are compared —
equal is a retry (nothing is written, so the commit costs no fsync), different is an
``IdempotencyCollision``; not found, ``INSERT ... ON CONFLICT DO NOTHING`` writes at most one
row per id however many threads or processes race.
"""

from __future__ import annotations

import uuid

from procledger.adapters.sql import journal as journal_rows
from procledger.adapters.sql.store import Store
from procledger.domain.errors import IdempotencyCollision, StoreError
from procledger.domain.notification import ProcessCompletionNotification
from procledger.notifications.journal import (
    JournalAppend,
    JournalEntry,
    decode_entry,
    journal_payload,
)


class NotificationJournal:
    """The ``journal`` side table of one store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def append(self, notification: ProcessCompletionNotification) -> JournalAppend:
        """Journal a notification the caller has just validated (see ``journal_append``)."""
        payload = journal_payload(notification)
        command_id = str(notification.command_id)
        with self.store.write() as tx:
            row = journal_rows.entry(tx, command_id)
            if row is None:
                written = journal_rows.insert(
                    tx,
                    command_id,
                    session_id=str(notification.session_id),
                    loop_id=str(notification.loop_id),
                    process_handle=notification.process_handle,
                    payload=payload,
                )
                if written:
                    return JournalAppend(new=True)
                # PostgreSQL: a concurrent writer committed it after our read; this statement
                # (read committed) sees it.
                row = journal_rows.entry(tx, command_id)
        if row is None:  # pragma: no cover - the unique key held a row a statement ago
            raise StoreError(f"journal: command {command_id} neither inserted nor found")
        if row["payload"] != payload:
            raise IdempotencyCollision(
                f"command {command_id} is journalled with another payload "
                f"(stored {row['payload']}, new {payload}): retry only with the identical "
                "notification, or allocate a new command id"
            )
        return JournalAppend(new=False, consumed=bool(row["consumed"]))

    def get(self, command_id: uuid.UUID | str) -> ProcessCompletionNotification | None:
        with self.store.read() as tx:
            row = journal_rows.entry(tx, str(uuid.UUID(str(command_id))))
        return None if row is None else decode_entry(row)

    def mark_consumed(
        self, session_id: uuid.UUID, loop_id: uuid.UUID, command_id: uuid.UUID
    ) -> bool:
        with self.store.write() as tx:
            return journal_rows.mark_consumed(tx, str(command_id), str(session_id), str(loop_id))

    def undelivered(
        self, session_id: uuid.UUID, loop_id: uuid.UUID
    ) -> list[ProcessCompletionNotification]:
        with self.store.read() as tx:
            rows = journal_rows.unconsumed(tx, str(session_id), str(loop_id))
        return [decode_entry(row) for row in rows]

    def entries(self, session_id: uuid.UUID | None = None) -> list[JournalEntry]:
        with self.store.read() as tx:
            rows = journal_rows.entries(tx, str(session_id) if session_id else None)
        return [
            JournalEntry(int(row["seq"]), decode_entry(row), bool(row["consumed"])) for row in rows
        ]
