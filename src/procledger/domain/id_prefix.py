"""Which process a typed id names (docs/design.md §8): the id itself, a service's name (§19),
or a unique prefix of a whole id or of its random part -- the short id ``ps`` shows on a
terminal, since every minted id begins with the time and so every id of a real ledger shares
its first digits. A prefix that
matches only the attempts of one service names the service (its first attempt).

Pure over two reads the caller supplies, so the registry and the CLI's fast path (which reads
the ``records`` table without a model, §8.1) resolve an id by the same rules.
"""

from __future__ import annotations

from collections.abc import Callable

from procledger.domain.errors import AmbiguousProcessId, NotFound

__all__ = ["PREFIX_CANDIDATES", "SERVICE_ATTEMPTS", "resolve"]

PREFIX_CANDIDATES = 5
"""How many matching ids an ambiguous prefix's error lists."""
SERVICE_ATTEMPTS = 10_000
"""How many attempts of one service a prefix may match and still name the service."""

Matching = Callable[[str, int], list[str]]
"""``(prefix, limit)`` -> up to ``limit`` ids, sorted, that start with the prefix or whose
random part does."""


def resolve(
    text: str,
    matching: Matching,
    is_first_attempt: Callable[[str], bool],
    named: Callable[[str], str | None] = lambda _: None,
) -> str:
    """The one process id ``text`` names: an id, else the first attempt of the service last
    given the name ``text`` (``named``), else the one id it is a prefix of. Raises ``NotFound``
    (nothing matches) or ``AmbiguousProcessId`` (several ids do, not all one service's
    attempts)."""
    if not text:
        raise NotFound("an empty process id prefix names no process")
    found = matching(text, PREFIX_CANDIDATES + 1)
    if text in found:
        return text
    holder = named(text)
    if holder is not None:
        return holder
    if not found:
        raise NotFound(
            f"process {text!r} not found (no id starts with it, no service has that name)"
        )
    if len(found) == 1:
        return found[0]
    if is_first_attempt(found[0]):
        every = matching(text, SERVICE_ATTEMPTS + 1)
        later = f"{found[0]}."
        if len(every) <= SERVICE_ATTEMPTS and all(
            i == found[0] or (i.startswith(later) and i[len(later) :].isdigit()) for i in every
        ):
            return found[0]
    more = len(found) > PREFIX_CANDIDATES
    raise AmbiguousProcessId(text, found[:PREFIX_CANDIDATES], more=more)
