"""Builders shared by the notification tests."""

from __future__ import annotations

import uuid
from typing import Any

from procledger.domain.notification import ProcessCompletionNotification

FIELDS = ("command_id", "session_id", "loop_id", "process_handle", "state", "reason")
ZERO_UUID = "00000000-0000-0000-0000-000000000000"

# The completed and lost rows of docs/design.md §2.1, written out by hand (not derived from the code
# under test): the only (state, reason) pairs a completion notification may carry.
NOTIFICATION_PAIRS = frozenset(
    {
        ("exited", "exited"),
        ("failed", "failed"),
        ("failed", "ready_timeout"),
        ("timed_out", "timed_out"),
        ("interrupted", "interrupted"),
        ("terminated", "terminated"),
        ("terminated", "runner_shutdown"),
        ("terminated", "output_limit"),
        ("killed", "killed"),
        ("killed", "runner_shutdown"),
        ("killed", "output_limit"),
        ("signaled", "signaled"),
        ("lost_on_restore", "lost_on_restore"),
    }
)


def fields(
    session_id: uuid.UUID | None = None, loop_id: uuid.UUID | None = None, **overrides: Any
) -> dict[str, Any]:
    """A valid notification as a JSON-native dict (fresh command id unless overridden)."""
    data: dict[str, Any] = {
        "command_id": str(uuid.uuid4()),
        "session_id": str(session_id or uuid.uuid4()),
        "loop_id": str(loop_id or uuid.uuid4()),
        "process_handle": "AAAAAAAAAAAAAAAAAAAAAA",
        "state": "exited",
        "reason": "exited",
    }
    data.update(overrides)
    return data


def notification(
    session_id: uuid.UUID | None = None, loop_id: uuid.UUID | None = None, **overrides: Any
) -> ProcessCompletionNotification:
    return ProcessCompletionNotification.model_validate(fields(session_id, loop_id, **overrides))
