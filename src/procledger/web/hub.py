"""One reader of the change feed per server, shared by every stream (docs/design.md §5.1, §16).

A poller follows ``scan_changes`` from the feed's head, woken by the store's news of a
commit (``wake.LedgerWake``: LISTEN, inotify, or a backing-off poll) rather than a clock, and
keeps the recent changes in memory, each with its row already encoded; a stream asks for the
changes after its cursor and waits for more. A cursor older than what is kept (a browser that
reconnects after a restart, or one that fell far behind) is served from the ledger itself,
page by page, until it reaches the kept window. Since the feed never skips, a stream that
resumes from its ``Last-Event-ID`` sees every change after it, in order, exactly once.

The hub also keeps the counts per status above the processes list (``StatusCounts``): read
once from the whole feed when the server starts, in the background, then kept up to date from
the changes it reads anyway -- so counting costs nothing per page or per stream.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from anyio import to_thread

from procledger.application.retention import PrunedSince
from procledger.web.views import StatusCounts, row_json
from procledger.web.wake import LedgerWake

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry
    from procledger.domain.records import ProcessRecord

logger = logging.getLogger("procledger.web")
PAGE = 500
"""Changes read per query, by the poller and by a stream catching up."""
KEEP = 5_000
"""How many recent changes stay in memory for the streams to read without a query."""


@dataclass(frozen=True)
class Change:
    """One change of the feed: its position, the record at that change, and its row as JSON."""

    seq: int
    record: ProcessRecord
    row: str

    @classmethod
    def of(cls, record: ProcessRecord) -> Change:
        return cls(record.change_seq, record, row_json(record))


def feed_head(registry: ProcessRegistry) -> int:
    """The feed's current position, found with a few one-row reads (no scan of the whole
    feed): ``changes_since(x, 1)`` says whether anything lies past ``x`` and names the next
    change; a gallop then a bisection finds the last. Everything at or below it is visible,
    since the feed never skips."""
    low, step, high = 0, 1, None
    while high is None:  # gallop: something at ``low`` (or nothing at all)
        found, _ = registry.changes_since(low + step, 1)
        if found:
            low, step = found[0].change_seq, step * 2
        else:
            high = low + step  # nothing past it
    while low < high:  # the last change lies in [low, high]
        middle = (low + high) // 2
        found, _ = registry.changes_since(middle, 1)
        if found:
            low = found[0].change_seq
        else:
            high = middle
    return low


class FeedHub:
    """The changes after ``base`` that the poller has read, up to ``head``; ``follow`` gives a
    stream everything after its cursor, from here or from the ledger."""

    def __init__(self, registry: ProcessRegistry, *, keep: int = KEEP):
        self.registry = registry
        self.keep = keep
        self.base = self.head = 0
        self._changes: list[Change] = []
        self._seqs: list[int] = []
        self._tick = asyncio.Event()
        self.ready = asyncio.Event()
        self._counts = StatusCounts()
        self._counted = False
        self._pruned = PrunedSince(registry)  # records the counts hold that a prune deleted

    @property
    def counts(self) -> StatusCounts | None:
        """The counts per status of the whole ledger; ``None`` until the first reading of the
        feed is over (a large ledger's takes a moment after the server starts)."""
        return self._counts if self._counted else None

    async def run(self) -> None:
        """Read the feed whenever it may have changed, until cancelled; a store error is
        logged and retried, never fatal."""
        wake = await LedgerWake.open(self.registry)
        logger.info("the web view follows the ledger by %s", wake.how)
        counting: asyncio.Task[None] | None = None
        try:
            self.base = self.head = await to_thread.run_sync(feed_head, self.registry)
            self._pruned.prunes = await to_thread.run_sync(self.registry.prunes_so_far)
            self.ready.set()
            counting = asyncio.create_task(self._count_all())
            while True:
                try:
                    full = await self._poll(wake)
                except Exception:
                    logger.exception("reading the change feed failed; retrying in a second")
                    await asyncio.sleep(1.0)
                    continue
                if not full:
                    await wake.wait()
        finally:
            if counting is not None:
                counting.cancel()
            wake.close()

    async def _count_all(self) -> None:
        """The counts' first reading: every record, along the feed from its start (each record
        once, at its latest change), a page at a time; then the streams are told. A prune
        made meanwhile may have deleted records after their page was read: looked for again."""
        cursor, prunes = 0, self._pruned.prunes
        while True:
            try:
                page = await to_thread.run_sync(self.registry.scan_changes, cursor, PAGE)
            except Exception:
                logger.exception("counting the ledger's processes failed; retrying in a second")
                await asyncio.sleep(1.0)
                continue
            for record in page.records:
                self._counts.add(record)
            cursor = max(cursor, int(page.cursor))
            if len(page.records) + len(page.damaged) < PAGE:
                break
        self._pruned.look_again_from(prunes)
        with contextlib.suppress(Exception):  # the next wake looks again
            await self._forget_pruned()
        self._counted = True
        self._wake_streams()

    def _wake_streams(self) -> None:
        self._tick.set()
        self._tick = asyncio.Event()

    async def _poll(self, wake: LedgerWake) -> bool:
        page = await to_thread.run_sync(self.registry.scan_changes, self.head, PAGE)
        for damaged in page.damaged:
            logger.warning("process %s changed but its record cannot be read (see verify)", damaged)
        if page.records:
            for record in page.records:
                self._counts.add(record)
            fresh = [Change.of(record) for record in page.records]
            self._changes.extend(fresh)
            self._seqs.extend(change.seq for change in fresh)
        self.head = max(self.head, int(page.cursor))
        if len(self._changes) > 2 * self.keep:
            cut = len(self._changes) - self.keep
            self.base = self._seqs[cut - 1]
            del self._changes[:cut], self._seqs[:cut]
        pruned = await self._forget_pruned()
        if page.records or page.damaged or pruned:
            wake.changed()
            self._wake_streams()
        return len(page.records) + len(page.damaged) >= PAGE

    async def _forget_pruned(self) -> bool:
        """The counted records a prune deleted leave the counts (a prune writes nothing to
        the feed): one indexed read at each wake unless there was one."""
        gone = await to_thread.run_sync(self._pruned.gone, self._counts.ids())
        for process_id in gone:
            self._counts.discard(process_id)
        return bool(gone)

    async def follow(self, cursor: int, idle_s: float = 15.0) -> AsyncIterator[list[Change]]:
        """Batches of the changes after ``cursor``, in feed order, for as long as the caller
        iterates; an empty batch after ``idle_s`` without any (a stream sends a keep-alive,
        which is how it learns that its client went away) or when the hub's news held no
        change (the counts became known: a stream sends them)."""
        await self.ready.wait()
        while True:
            if cursor < self.base:
                batch, cursor = await self._from_ledger(cursor)
            else:
                tick = self._tick
                batch = self._changes[bisect.bisect_right(self._seqs, cursor) :]
                if not batch:
                    try:
                        await asyncio.wait_for(tick.wait(), idle_s)
                    except TimeoutError:
                        yield []
                        continue
                    if not self._seqs or self._seqs[-1] <= cursor:
                        yield []  # news but no change (the counts became known)
                    continue
                cursor = batch[-1].seq
            if batch:
                yield batch

    async def _from_ledger(self, cursor: int) -> tuple[list[Change], int]:
        """A page of the changes after ``cursor`` read from the ledger, and the cursor after it;
        with nothing visible past it, the kept window's start (nothing lies in between)."""
        records, _ = await to_thread.run_sync(self.registry.changes_since, cursor, PAGE)
        if not records:
            return [], max(cursor, self.base)
        return [Change.of(record) for record in records], records[-1].change_seq
