"""What wakes the feed hub: the store's own news of a commit, not a clock (docs/design.md §16.2).

A server nobody looks at should cost nothing, yet a change should reach an open page within
a blink. So the hub sleeps until something says the ledger may have changed:

- this server's own writes (a Stop from the page): the registry's change signal;
- PostgreSQL: the ``LISTEN`` connection every append ``NOTIFY``s, readable at each commit by
  any process; a read every ``LISTEN_CHECK_S`` covers a notification lost with its connection;
- SQLite: inotify on the database's folder, filtered to the database and its ``-wal`` and
  ``-journal`` files -- a commit by any process on this machine writes one of them (readers
  write neither: the ``-shm`` index is shared memory, which inotify does not see). The write
  comes a moment *before* the commit is visible (a WAL commit is published in that shared
  index after its last frame is written), so news is followed by reads at ``FIRST_POLL_S``,
  doubling to ``SETTLE_S``; then a read every ``INOTIFY_CHECK_S`` covers writes inotify
  cannot see (another machine's, on a network file system);
- neither (no inotify, ``memory://``): a poll that starts at ``FIRST_POLL_S`` after a change
  and doubles to ``LONGEST_POLL_S`` while nothing changes.

A wake-up only means "read the feed": the hub's read decides what changed, so a spurious wake
costs one indexed read and a lost one is bounded by the check interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Final

from anyio import to_thread

from procledger.adapters.direct_output import (
    IN_MODIFY,
    IN_MOVED_TO,
    IN_Q_OVERFLOW,
    inotify_events,
    inotify_on,
)

if TYPE_CHECKING:
    from procledger.application.changes import ChangeListener
    from procledger.application.registry import ProcessRegistry

logger = logging.getLogger("procledger.web")

FIRST_POLL_S: Final = 0.05
LONGEST_POLL_S: Final = 1.0
LISTEN_CHECK_S: Final = 5.0
INOTIFY_CHECK_S: Final = 2.0
SETTLE_S: Final = 0.4


class FolderWatch:
    """inotify on the folder of a SQLite database: readable when the database, its ``-wal``
    or its ``-journal`` is written or replaced. A folder, not the files: SQLite deletes and
    makes the ``-wal`` again as connections come and go, and a file watch would follow the
    old one."""

    def __init__(self, database: Path) -> None:
        self._names = {os.fsencode(database.name + tail) for tail in ("", "-wal", "-journal")}
        self._fd = inotify_on(database.parent, IN_MODIFY | IN_MOVED_TO)

    def fileno(self) -> int:
        return self._fd

    def drain(self) -> bool:
        """Consume the events so far (never blocks); whether any was about the database."""
        return any(
            mask & IN_Q_OVERFLOW or name in self._names
            for _wd, mask, name in inotify_events(self._fd)
        )

    def close(self) -> None:
        os.close(self._fd)


class LedgerWake:
    """Sleeps until the ledger may have changed. Every source sets one event from the loop
    (a reader on a descriptor) or from a writer's thread; ``wait`` clears it before the hub
    reads, so news that comes during a read wakes the next wait at once."""

    def __init__(self, registry: ProcessRegistry, source: ChangeListener | FolderWatch | None):
        self._loop = asyncio.get_running_loop()
        self._news = asyncio.Event()
        self._source = source
        self._unsubscribe = registry.subscribe_changes(self._told)
        self._pause = FIRST_POLL_S
        if source is not None:
            self._loop.add_reader(source.fileno(), self._readable)

    @classmethod
    async def open(cls, registry: ProcessRegistry) -> LedgerWake:
        """The best source this store has; a failing one is logged and polling used."""
        return cls(registry, await to_thread.run_sync(_source_of, registry))

    @property
    def how(self) -> str:
        """What wakes it: ``listen``, ``inotify`` or ``poll`` (for the log and the tests)."""
        if self._source is None:
            return "poll"
        return "inotify" if isinstance(self._source, FolderWatch) else "listen"

    def changed(self) -> None:
        """The last read found changes: more may follow soon, so a poll starts short again."""
        self._pause = FIRST_POLL_S

    async def wait(self) -> None:
        """Until news comes, or the check interval (polling: the growing pause) passes."""
        watching = isinstance(self._source, FolderWatch)
        if self._source is None or (watching and self._pause <= SETTLE_S):
            timeout, self._pause = self._pause, min(self._pause * 2, LONGEST_POLL_S)
        else:
            timeout = INOTIFY_CHECK_S if watching else LISTEN_CHECK_S
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._news.wait(), timeout)
        self._news.clear()

    def _told(self) -> None:
        """A commit of this registry, on the writer's thread."""
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            self._loop.call_soon_threadsafe(self._news.set)

    def _readable(self) -> None:
        assert self._source is not None
        try:
            news = self._source.drain()
        except Exception as error:  # a lost LISTEN connection: poll from now on
            logger.warning("the ledger's change channel failed (polling instead): %s", error)
            self._drop_source()
            news = True
        if news:
            self._news.set()
            self._pause = FIRST_POLL_S  # a file write: the commit may become visible just after

    def _drop_source(self) -> None:
        if self._source is not None:
            self._loop.remove_reader(self._source.fileno())
            self._source.close()
            self._source = None

    def close(self) -> None:
        self._unsubscribe()
        self._drop_source()


def _source_of(registry: ProcessRegistry) -> ChangeListener | FolderWatch | None:
    """PostgreSQL's LISTEN connection, else inotify on a SQLite file's folder, else None."""
    try:
        listener = registry.open_change_listener()
    except Exception as error:
        logger.warning("no LISTEN connection (the web view polls the ledger): %s", error)
        return None
    if listener is not None:
        return listener
    database = registry.location.sqlite_path
    if not database or database.startswith("file:") or ":memory:" in database:
        return None
    try:
        return FolderWatch(Path(database).resolve())
    except (OSError, AttributeError) as error:  # AttributeError: a libc without inotify
        logger.warning("no inotify on the ledger's folder (the web view polls it): %s", error)
        return None
