"""Per-registration caches: work that depends only on a registration's content, done once.

Every load of a process replays its ``Registered`` event, and every write renders its record;
validating the same registration again was a fifth of a load. Keys are the registration's
content hash, so two aggregates of one registration share an entry, and the values are frozen
models or never-mutated dicts, so sharing them is safe. Each cache is bounded: a long-lived
registry sees an unbounded number of registrations.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from procledger.domain.registration import ProcessRegistration

V = TypeVar("V")

#: Entries kept per cache before it starts again from empty.
CACHE_LIMIT = 4096


class RegistrationCache(Generic[V]):
    """A value per registration hash, bounded by clearing (cheaper than LRU bookkeeping, and
    a miss only costs the work the cache saves)."""

    def __init__(self, limit: int = CACHE_LIMIT) -> None:
        self.limit = limit
        self.values: dict[str, V] = {}

    def get(self, registration_hash: str) -> V | None:
        return self.values.get(registration_hash)

    def put(self, registration_hash: str, value: V) -> V:
        if len(self.values) >= self.limit:
            self.values.clear()
        self.values[registration_hash] = value
        return value


REGISTRATIONS: RegistrationCache[ProcessRegistration] = RegistrationCache()

_REGISTRATION_KEYS = frozenset(ProcessRegistration.model_fields)


def checked_registration_document(document: dict[str, Any]) -> dict[str, Any]:
    """A stored registration must have every field (``disposition`` has no default anywhere).

    The full validation runs when a command first needs the parsed registration; this cheap
    check makes a damaged event fail on replay, where the codec reports it with its process.
    """
    missing = _REGISTRATION_KEYS - document.keys()
    if missing:
        raise ValueError(f"stored registration lacks {', '.join(sorted(missing))}")
    return document


def remember_registration(registration_hash: str, registration: ProcessRegistration) -> None:
    """Seed the cache with a registration a caller already validated (a new ``register``)."""
    REGISTRATIONS.put(registration_hash, registration)


def parsed_registration(data: dict[str, Any], registration_hash: str) -> ProcessRegistration:
    """The registration of a ``Registered`` event, validated once per content hash."""
    parsed = REGISTRATIONS.get(registration_hash)
    if parsed is None:
        parsed = REGISTRATIONS.put(registration_hash, ProcessRegistration.model_validate(data))
    return parsed
