"""The names the Supervisor mints: process handles and process ids (docs/design.md §6.2).

A handle is what ``Supervisor.start`` gives its caller and what a completion notification names:
16 random bytes, URL-safe base64 without padding (22 characters). It encodes nothing (no pid,
path, owner or time), so it can be handed to an agent or written to a log safely.
"""

from __future__ import annotations

import base64
import secrets
import uuid
from typing import Final

__all__ = ["HANDLE_BYTES", "new_handle", "new_process_id"]

HANDLE_BYTES: Final = 16


def new_handle() -> str:
    """16 random bytes as URL-safe base64 without padding: 22 characters of [A-Za-z0-9_-]."""
    return base64.urlsafe_b64encode(secrets.token_bytes(HANDLE_BYTES)).rstrip(b"=").decode()


def new_process_id(now_ms: int) -> str:
    """A fresh process id for a caller that names none: the time first (11 hex digits of
    milliseconds), so ids sort by creation, then 12 random hex digits -- the short id ``ps``
    shows on a terminal, as docker shows 12 characters of a container's id -- so two processes
    registered in the same millisecond do not collide, and a prefix of the random part names
    one process in any real ledger (docs/design.md §8). Ids minted before had 8."""
    return f"{now_ms:011x}-{uuid.uuid4().hex[:12]}"
