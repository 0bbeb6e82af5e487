"""The notification journal of one ledger: process notifications (completions and waits for
input) stored as commands before they are dispatched, unique by command id (see
``procledger.notifications.journal``).

In one write transaction the stored payload is read first: found, the bytes are compared —
equal is a retry (nothing is written, so the commit costs no fsync), different is an
``IdempotencyCollision``; not found, ``INSERT ... ON CONFLICT DO NOTHING`` writes at most one
row per id however many threads or processes race.

Every transaction here runs through ``Store.attempt``, so a connection lost mid-way (a
PostgreSQL restart) re-runs it from scratch rather than failing the call (docs/design.md
§7.3). Each body is safe to run again: the append reads the row before it writes (an insert
whose commit was acknowledged to nobody is then found, with the same payload), and marking an
entry consumed sets a flag that is already set on a second run.
"""

from __future__ import annotations

import uuid
from typing import Any

from procledger.adapters.sql import journal_rows
from procledger.adapters.sql.store import Store, Tx
from procledger.domain.errors import IdempotencyCollision, StoreError
from procledger.domain.notification import Notification
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

    def append(self, notification: Notification) -> JournalAppend:
        """Journal a notification the caller has just validated (see ``journal_append``)."""
        payload = journal_payload(notification)
        command_id = str(notification.command_id)

        def insert_or_read(tx: Tx) -> tuple[bool, Any]:
            """``(True, None)`` when this transaction wrote the row, else ``(False, row)``.
            The row is read first, so a run repeated after a lost commit finds it."""
            row = journal_rows.entry(tx, command_id)
            if row is not None:
                return False, row
            written = journal_rows.insert(
                tx,
                command_id,
                session_id=str(notification.session_id),
                loop_id=str(notification.loop_id),
                process_handle=notification.process_handle,
                payload=payload,
            )
            # Not written on PostgreSQL: a concurrent writer committed it after our read;
            # this statement (read committed) sees it.
            return (True, None) if written else (False, journal_rows.entry(tx, command_id))

        written, row = self.store.attempt(insert_or_read, write=True)
        if written:
            return JournalAppend(new=True)
        if row is None:  # pragma: no cover - the unique key held a row a statement ago
            raise StoreError(f"journal: command {command_id} neither inserted nor found")
        if row["payload"] != payload:
            raise IdempotencyCollision(
                f"command {command_id} is journalled with another payload "
                f"(stored {row['payload']}, new {payload}): retry only with the identical "
                "notification, or allocate a new command id"
            )
        return JournalAppend(new=False, consumed=bool(row["consumed"]))

    def get(self, command_id: uuid.UUID | str) -> Notification | None:
        key = str(uuid.UUID(str(command_id)))
        row = self.store.attempt(lambda tx: journal_rows.entry(tx, key))
        return None if row is None else decode_entry(row)

    def mark_consumed(
        self, session_id: uuid.UUID, loop_id: uuid.UUID, command_id: uuid.UUID
    ) -> bool:
        """Mark the loop's entry consumed; ``False`` if the loop has no such entry. Setting
        the flag twice is harmless, so a transaction lost mid-way simply runs again."""
        keys = (str(command_id), str(session_id), str(loop_id))
        return self.store.attempt(lambda tx: journal_rows.mark_consumed(tx, *keys), write=True)

    def undelivered(self, session_id: uuid.UUID, loop_id: uuid.UUID) -> list[Notification]:
        rows = self.store.attempt(
            lambda tx: journal_rows.unconsumed(tx, str(session_id), str(loop_id))
        )
        return [decode_entry(row) for row in rows]

    def entries(self, session_id: uuid.UUID | None = None) -> list[JournalEntry]:
        session = str(session_id) if session_id else None
        rows = self.store.attempt(lambda tx: journal_rows.entries(tx, session))
        return [
            JournalEntry(int(row["seq"]), decode_entry(row), bool(row["consumed"])) for row in rows
        ]
