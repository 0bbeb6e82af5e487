"""Following the change feed from an event loop (docs/design.md §17, §5.1).

``follow`` reads pages of ``changes_since`` in a worker thread and, when a page comes back
empty, waits for a push: a PostgreSQL NOTIFY (every append sends one in its write
transaction), else a commit by this process's registry (its change signal), else a short poll
for other processes' commits. It never skips: it moves on only by the feed's own cursors, and
it starts listening before its first read, so a commit is either in a page or wakes it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, final

import anyio
from anyio import to_thread

from procledger.aio.wakeup import Wakeup
from procledger.application.changes import ChangeCursor, ChangeListener
from procledger.domain.errors import StoreError
from procledger.domain.records import ProcessRecord

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = ["FeedChange", "follow"]

log = logging.getLogger("procledger.aio")

FIRST_POLL_S: Final = 0.005
LONGEST_POLL_S: Final = 0.1
"""Without a push from other processes (SQLite), an idle follower looks again after 5 ms,
doubling to 100 ms; a commit by this process wakes it at once."""

LISTEN_CHECK_S: Final = 1.0
"""With LISTEN, an idle follower still reads once a second (a NOTIFY lost with a connection)."""


@final
@dataclass(frozen=True, slots=True)
class FeedChange:
    """One changed record, at its latest state, and the cursor to resume from after it:
    every change up to ``cursor`` has been yielded (store it, hand it back to ``follow``)."""

    record: ProcessRecord
    cursor: ChangeCursor


class _Pushes:
    """How an idle follower is woken: the LISTEN socket, or the local change signal."""

    def __init__(self, registry: ProcessRegistry) -> None:
        self._wakeup = Wakeup()
        self._unsubscribe: Callable[[], None] = registry.subscribe_changes(self._wakeup.set)
        self._listener: ChangeListener | None = None
        try:
            self._listener = registry.open_change_listener()
        except StoreError as error:
            log.warning("feed follower: no LISTEN (polling instead): %s", error)
        self._pause = FIRST_POLL_S

    def read(self) -> None:
        """A page is being read: what woke us is accounted for, and polling starts afresh."""
        self._pause = FIRST_POLL_S

    async def wait(self) -> None:
        """Until something may have changed."""
        listener = self._listener
        if listener is None:
            await self._wakeup.wait(self._pause)
            self._pause = min(self._pause * 2, LONGEST_POLL_S)
            return
        with anyio.move_on_after(LISTEN_CHECK_S):
            await anyio.wait_readable(listener.fileno())
        try:
            listener.drain()
        except StoreError as error:
            log.warning("feed follower: LISTEN connection lost (polling instead): %s", error)
            listener.close()
            self._listener = None

    def close(self) -> None:
        self._unsubscribe()
        self._wakeup.close()
        if self._listener is not None:
            self._listener.close()


def _with_cursors(
    records: Sequence[ProcessRecord], start: ChangeCursor, end: ChangeCursor
) -> Iterator[FeedChange]:
    """Each record with the cursor that is safe after it: records sharing a ``change_seq``
    (one event changed several) resume before the first of them until the last is out."""
    safe = start
    for index, record in enumerate(records):
        following = records[index + 1].change_seq if index + 1 < len(records) else None
        if following is None:
            safe = end
        elif following != record.change_seq:
            safe = ChangeCursor(record.change_seq)
        yield FeedChange(record, safe)


async def follow(
    registry: ProcessRegistry,
    cursor: ChangeCursor | int | None = None,
    *,
    limit: int = 256,
) -> AsyncGenerator[FeedChange, None]:
    """Every change after ``cursor`` (the start of the feed when omitted), then each new one
    as it is committed, for ever: ``async for change in follow(registry, cursor)``.

    Pages are read in a worker thread (one at a time); breaking out of the loop or cancelling
    the task ends the follower and releases its connection.

    Raises:
        ValueError: ``limit`` is not positive.
        StoreError: a read failed (the cursor of the last change yielded is safe to resume).
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive int, not {limit!r}")
    position = ChangeCursor.of(0 if cursor is None else cursor)
    pushes = await to_thread.run_sync(_Pushes, registry)
    try:
        while True:
            records, after = await to_thread.run_sync(registry.changes_since, position, limit)
            for change in _with_cursors(records, position, after):
                yield change
            if after != position:  # also past a page of damaged rows only (none yielded)
                position = after
                pushes.read()
            else:
                await pushes.wait()
    finally:
        pushes.close()  # quick: a callback off a list, a pipe, a connection's goodbye
