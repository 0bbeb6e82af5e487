"""Per-registration caches: work that depends only on a registration's content, done once.

Every load of a process replays its ``Registered`` event, and every write renders its record;
validating the same registration again was a fifth of a load. Keys are the registration's
content hash, so two aggregates of one registration share an entry, and the values are frozen
models or never-mutated dicts, so sharing them is safe. Each cache is bounded: a long-lived
registry sees an unbounded number of registrations.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from procledger.domain.errors import StoreCorrupt
from procledger.domain.registration import (
    OPTIONAL_REGISTRATION_KEYS,
    ProcessRegistration,
    registration_hash_of,
)

V = TypeVar("V")

#: Entries kept per cache before it starts again from empty.
CACHE_LIMIT = 4096


class RegistrationCache(Generic[V]):
    """A value per registration hash, bounded by clearing (cheaper than LRU bookkeeping, and
    a miss only costs the work the cache saves)."""

    def __init__(self, limit: int = CACHE_LIMIT) -> None:
        self.limit = limit
        self.values: dict[str, V] = {}
        _ALL.append(self)

    def get(self, registration_hash: str) -> V | None:
        return self.values.get(registration_hash)

    def put(self, registration_hash: str, value: V) -> V:
        if len(self.values) >= self.limit:
            self.values.clear()
        self.values[registration_hash] = value
        return value


_ALL: list[RegistrationCache[Any]] = []


def limit_caches(limit: int) -> None:
    """Bound every registration cache of this process to ``limit`` entries: for a process that
    holds many runs and writes each rarely (the host agent), where a cached registration per
    run costs more memory than its reuse saves time."""
    for cache in _ALL:
        cache.limit = limit
        if len(cache.values) > limit:
            cache.values.clear()


REGISTRATIONS: RegistrationCache[ProcessRegistration] = RegistrationCache()

_REGISTRATION_KEYS = frozenset(ProcessRegistration.model_fields) - OPTIONAL_REGISTRATION_KEYS


def checked_registration_document(document: dict[str, Any]) -> dict[str, Any]:
    """A stored registration must have every field (``disposition`` has no default anywhere).

    The full validation runs when a command first needs the parsed registration; this cheap
    check makes a damaged event fail on replay, where the codec reports it with its process.
    """
    missing = _REGISTRATION_KEYS - document.keys()
    if missing:
        raise ValueError(f"stored registration lacks {', '.join(sorted(missing))}")
    return document


# The document a ``register`` just hashed, per hash: creating its aggregate then finds the very
# same object and skips hashing it twice. A document read from the store is a new object, so
# every load of a process hashes its registration once (~3 µs) — and only a load that replays
# the ``Registered`` event: the registry's reused aggregates skip it on most writes.
_HASHED: RegistrationCache[Any] = RegistrationCache()


def remember_hashed(document: dict[str, Any]) -> str:
    """The registration hash of a document about to be registered, remembered for its
    aggregate's creation."""
    registration_hash = registration_hash_of(document)
    _HASHED.put(registration_hash, document)
    return registration_hash


def check_registration_hash(document: Any, registration_hash: Any) -> None:
    """Tamper evidence (docs/design.md §3.1): a stored registration must still hash to the
    ``registration_hash`` stored beside it, or the process is ``StoreCorrupt`` — an edited
    argv would otherwise run, and a rebuild would spread it."""
    if _HASHED.get(registration_hash) is document:
        return
    if registration_hash_of(document) != registration_hash:
        process_id = document.get("id") if isinstance(document, dict) else None
        name = process_id if isinstance(process_id, str) else None
        raise StoreCorrupt(
            f"process {name!r}: registration does not match its hash", process_id=name
        )


def remember_registration(registration_hash: str, registration: ProcessRegistration) -> None:
    """Seed the cache with a registration a caller already validated (a new ``register``)."""
    REGISTRATIONS.put(registration_hash, registration)


def parsed_registration(data: dict[str, Any], registration_hash: str) -> ProcessRegistration:
    """The registration of a ``Registered`` event, validated once per content hash."""
    parsed = REGISTRATIONS.get(registration_hash)
    if parsed is None:
        parsed = REGISTRATIONS.put(registration_hash, ProcessRegistration.model_validate(data))
    return parsed
