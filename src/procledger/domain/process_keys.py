"""A process's key in the event store: the name-based UUID of its id. Pure hashing, with no
model behind it, so the CLI's fast path finds a process's events as the registry does
(docs/design.md §8.1).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import uuid

__all__ = ["process_key_hex", "process_uuid"]

_NAMESPACE_BYTES = bytes.fromhex("6f1c2d7e5b0a4c1e9a530d4c6e1f7a21")
"""Our namespace UUID's bytes (``uuid`` itself is imported only where a ``UUID`` is made: it
costs the CLI's fast path a millisecond)."""


@functools.lru_cache(maxsize=4096)
def process_uuid(process_id: str) -> uuid.UUID:
    """Deterministic aggregate id: registering one id twice collides in the store."""
    import uuid  # noqa: PLC0415 -- see _NAMESPACE_BYTES

    return uuid.UUID(bytes=_process_key(process_id))


def process_key_hex(process_id: str) -> str:
    """``process_uuid(process_id).hex`` without a ``UUID`` object: a rebuild asks it of every
    record it sweeps, and building the object costs several times the hash."""
    return _process_key(process_id).hex()


def _process_key(process_id: str) -> bytes:
    """The bytes of the name-based (version 5) UUID of ``process_id`` in our namespace, as
    ``uuid.uuid5`` makes them."""
    import hashlib  # noqa: PLC0415 -- a listing needs no key: see _NAMESPACE_BYTES

    key = bytearray(hashlib.sha1(_NAMESPACE_BYTES + process_id.encode()).digest()[:16])
    key[6] = (key[6] & 0x0F) | 0x50
    key[8] = (key[8] & 0x3F) | 0x80
    return bytes(key)
