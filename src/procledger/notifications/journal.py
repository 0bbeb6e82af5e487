"""The durable notification journal: its contract and stored form (the registry implements
it in ``procledger.application.journal``).

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
from typing import Any, NamedTuple, Protocol

from procledger.domain.errors import (
    ProcessLifecycleValidationError,
    StoreCorrupt,
)
from procledger.domain.model import canonical_json
from procledger.domain.notification import ProcessCompletionNotification


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


def decode_entry(row: Any) -> ProcessCompletionNotification:
    """A journal row's notification; a damaged payload is ``StoreCorrupt`` naming the entry."""
    try:
        return ProcessCompletionNotification.model_validate_json(row["payload"])
    except (ProcessLifecycleValidationError, ValueError) as error:
        raise StoreCorrupt(
            f"journal entry {row['seq']} (command {row['command_id']}): corrupt payload: {error}"
        ) from None
