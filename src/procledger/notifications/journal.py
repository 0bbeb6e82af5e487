"""The durable notification journal, as registry methods.

A completion notification is journalled, keyed by its ``command_id``, **before** it is
dispatched to a loop, so nothing the runner published is lost when the loop is full, stopped or
gone. The journalled command is the notification's canonical JSON and nothing else — no
timestamp, no sequence number inside it — so a true retry is byte-identical and deduplicates
on the ``command_id`` unique key:

* in one write transaction, the stored payload is read first: found, the bytes are compared —
  equal is a retry (nothing is written, so the commit costs no fsync), different is an
  ``IdempotencyCollision``;
* not found, ``INSERT ... ON CONFLICT (command_id) DO NOTHING`` writes at most one row per id
  however many threads or OS processes race (SQLite serialises writers; on PostgreSQL the
  unique index makes the loser wait for the winner's commit and do nothing, and the loser's
  next read sees the winner's row and compares as above).

``consumed`` is the only column that ever changes: the owning loop marks what it has handled,
and restore (``journal_undelivered``) returns the rest in journal order.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from procledger.domain._model import canonical_json
from procledger.domain.errors import (
    IdempotencyCollision,
    ProcessLifecycleValidationError,
    StoreError,
)
from procledger.domain.notification import ProcessCompletionNotification

if TYPE_CHECKING:
    from procledger.adapters.store import Store, Tx


class JournalAppend(NamedTuple):
    """What an append found: ``new`` (this call wrote the row) and, for an identical retry,
    whether the owning loop has consumed it already."""

    new: bool
    consumed: bool = False


class JournalEntry(NamedTuple):
    """One journalled command, in journal order (``seq``)."""

    seq: int
    notification: ProcessCompletionNotification
    consumed: bool


class Journal(Protocol):
    """What a ``Notifier`` needs from its registry (``ProcessRegistry`` provides it)."""

    def journal_append_checked(
        self, notification: ProcessCompletionNotification
    ) -> JournalAppend: ...

    def journal_mark_consumed(
        self, session_id: uuid.UUID, loop_id: uuid.UUID, command_id: uuid.UUID
    ) -> bool: ...

    def journal_undelivered(
        self, session_id: uuid.UUID, loop_id: uuid.UUID
    ) -> list[ProcessCompletionNotification]: ...


def journal_payload(notification: ProcessCompletionNotification) -> str:
    """The stored form: sorted-key compact JSON of the six fields (byte-identical on retry)."""
    return canonical_json(notification.model_dump(mode="json")).decode()


def _decode(row: Any) -> ProcessCompletionNotification:
    try:
        return ProcessCompletionNotification.model_validate_json(row["payload"])
    except ProcessLifecycleValidationError as error:
        raise StoreError(
            f"journal entry {row['seq']} (command {row['command_id']}): corrupt payload: {error}"
        ) from None


class JournalMixin:
    """Mixed into ``ProcessRegistry``: the journal side table, through ``self.store``."""

    store: Store

    def journal_append(self, notification: ProcessCompletionNotification) -> JournalAppend:
        """Journal ``notification`` under its command id (validated again first).

        Returns ``JournalAppend(new=True)`` when this call wrote the row, ``new=False`` for an
        identical retry (with ``consumed`` telling whether the loop handled it already). The same
        id with a different payload raises ``IdempotencyCollision`` and writes nothing.
        """
        return self.journal_append_checked(notification.revalidated())

    def journal_append_checked(self, notification: ProcessCompletionNotification) -> JournalAppend:
        """``journal_append`` for a notification the caller has just validated."""
        payload = journal_payload(notification)
        command_id = str(notification.command_id)
        table = self.store.table("journal")
        with self.store.write() as tx:
            row = _journal_row(tx, table, command_id)
            if row is None:
                tx.execute(
                    f"INSERT INTO {table} (command_id, session_id, loop_id, process_handle, "
                    "payload) VALUES (?, ?, ?, ?, ?) ON CONFLICT (command_id) DO NOTHING",
                    (
                        command_id,
                        str(notification.session_id),
                        str(notification.loop_id),
                        notification.process_handle,
                        payload,
                    ),
                )
                if tx.rowcount == 1:
                    return JournalAppend(new=True)
                # PostgreSQL: a concurrent writer committed it after our read; this statement
                # (read committed) sees it.
                row = _journal_row(tx, table, command_id)
        if row is None:  # pragma: no cover - the unique key held a row a statement ago
            raise StoreError(f"journal: command {command_id} neither inserted nor found")
        if row["payload"] != payload:
            raise IdempotencyCollision(
                f"command {command_id} is journalled with another payload "
                f"(stored {row['payload']}, new {payload}): retry only with the identical "
                "notification, or allocate a new command id"
            )
        return JournalAppend(new=False, consumed=bool(row["consumed"]))

    def journal_get(self, command_id: uuid.UUID | str) -> ProcessCompletionNotification | None:
        """The journalled notification with that command id, or ``None``."""
        with self.store.read() as tx:
            row = _journal_row(tx, self.store.table("journal"), str(uuid.UUID(str(command_id))))
        return None if row is None else _decode(row)

    def journal_mark_consumed(
        self, session_id: uuid.UUID, loop_id: uuid.UUID, command_id: uuid.UUID
    ) -> bool:
        """Record that the loop handled the command; ``False`` if that loop has no such entry.

        Marking twice is harmless (the second call also returns ``True``).
        """
        with self.store.write() as tx:
            tx.execute(
                f"UPDATE {self.store.table('journal')} SET consumed=1 "
                "WHERE command_id=? AND session_id=? AND loop_id=?",
                (str(command_id), str(session_id), str(loop_id)),
            )
            return tx.rowcount == 1

    def journal_undelivered(
        self, session_id: uuid.UUID, loop_id: uuid.UUID
    ) -> list[ProcessCompletionNotification]:
        """The session's unconsumed notifications addressed to ``loop_id``, in journal order."""
        with self.store.read() as tx:
            rows = tx.execute(
                f"SELECT seq, command_id, payload FROM {self.store.table('journal')} "
                "WHERE session_id=? AND loop_id=? AND consumed=0 ORDER BY seq",
                (str(session_id), str(loop_id)),
            ).all()
        return [_decode(row) for row in rows]

    def journal_entries(self, session_id: uuid.UUID | None = None) -> list[JournalEntry]:
        """Every journalled command (or one session's), in journal order, consumed included."""
        where, params = ("WHERE session_id=? ", (str(session_id),)) if session_id else ("", ())
        with self.store.read() as tx:
            rows = tx.execute(
                f"SELECT seq, command_id, payload, consumed FROM {self.store.table('journal')} "
                f"{where}ORDER BY seq",
                params,
            ).all()
        return [JournalEntry(int(row["seq"]), _decode(row), bool(row["consumed"])) for row in rows]


def _journal_row(tx: Tx, table: str, command_id: str) -> Any:
    return tx.execute(
        f"SELECT seq, command_id, payload, consumed FROM {table} WHERE command_id=?",
        (command_id,),
    ).one()
