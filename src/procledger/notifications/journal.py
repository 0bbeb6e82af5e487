"""The durable notification journal: its contract and stored form (the registry implements
it in ``procledger.application.journal``).

A process notification (a completion, or a wait for input) is journalled, keyed by its
``command_id``, **before** it is dispatched to a loop, so nothing the runner published is lost
when the loop is full, stopped or gone. The journalled command is the notification's canonical
JSON and nothing else — no timestamp, no sequence number inside it — so a true retry is
byte-identical and deduplicates on the ``command_id`` unique key:

* in one write transaction, the stored payload is read first: found, the bytes are compared —
  equal is a retry (nothing is written, so the commit costs no fsync), different is an
  ``IdempotencyCollision``;
* not found, ``INSERT ... ON CONFLICT (command_id) DO NOTHING`` writes at most one row per id
  however many threads or OS processes race (SQLite serialises writers; on PostgreSQL the
  unique index makes the loser wait for the winner's commit and do nothing, and the loser's
  next read sees the winner's row and compares as above).

``consumed`` is the only column that ever changes: the owning loop marks what it has handled,
and restore (``journal_undelivered``) returns the rest in journal order.

The payload says which kind it holds in ``notification_type``. A completion leaves it out (it
is the default, ``process_completion``): its stored form stays the six keys journalled before
there was a second kind, so a completion published again after an upgrade (``restore``, under
its original command id) is still byte-identical to its old row, not a collision.
"""

from __future__ import annotations

import uuid
from typing import Any, Final, NamedTuple, Protocol

import orjson

from procledger.domain.errors import (
    ProcessLifecycleValidationError,
    StoreCorrupt,
)
from procledger.domain.model import canonical_json
from procledger.domain.notification import (
    Notification,
    ProcessCompletionNotification,
    ProcessInputNotification,
)

NOTIFICATION_TYPE: Final = "notification_type"
"""The stored payload's discriminator (absent: a completion)."""
_KINDS: Final[dict[str, type[Notification]]] = {
    "process_completion": ProcessCompletionNotification,
    "process_input": ProcessInputNotification,
}


class JournalAppend(NamedTuple):
    """What an append found: ``new`` (this call wrote the row) and, for an identical retry,
    whether the owning loop has consumed it already."""

    new: bool
    consumed: bool = False


class JournalEntry(NamedTuple):
    """One journalled command, in journal order (``seq``)."""

    seq: int
    notification: Notification
    consumed: bool


class Journal(Protocol):
    """What a ``Notifier`` needs from its registry (``ProcessRegistry`` provides it)."""

    def journal_append_checked(self, notification: Notification) -> JournalAppend: ...

    def journal_mark_consumed(
        self, session_id: uuid.UUID, loop_id: uuid.UUID, command_id: uuid.UUID
    ) -> bool: ...

    def journal_undelivered(
        self, session_id: uuid.UUID, loop_id: uuid.UUID
    ) -> list[Notification]: ...


def journal_payload(notification: Notification) -> str:
    """The stored form: sorted-key compact JSON of the fields (byte-identical on retry), with
    ``notification_type`` for every kind but a completion (see the module docstring)."""
    fields = notification.model_dump(mode="json")
    if isinstance(notification, ProcessInputNotification):
        fields[NOTIFICATION_TYPE] = "process_input"
    return canonical_json(fields).decode()


def decode_entry(row: Any) -> Notification:
    """A journal row's notification, of the kind its payload names; a damaged payload is
    ``StoreCorrupt`` naming the entry."""
    try:
        model, fields = _kind_and_fields(row["payload"])
        return model.model_validate(fields)
    except (ProcessLifecycleValidationError, ValueError) as error:
        raise StoreCorrupt(
            f"journal entry {row['seq']} (command {row['command_id']}): corrupt payload: {error}"
        ) from None


def _kind_and_fields(payload: str | bytes) -> tuple[type[Notification], dict[str, Any]]:
    fields = orjson.loads(payload)
    if not isinstance(fields, dict):
        raise ValueError("not a JSON object")
    kind = fields.pop(NOTIFICATION_TYPE, "process_completion")
    model = _KINDS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise ValueError(f"unknown {NOTIFICATION_TYPE} {kind!r}")
    return model, fields
