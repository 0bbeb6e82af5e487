"""A loop's notifications (completions and waits for input) as an async iterator
(docs/design.md §17, §4.3, §4.4).

``async for notification in notifications(inbox)`` takes the oldest pending notification
(``LoopInbox.take``: no other consumer can get it), marks it consumed -- durably, through the
notifier's journal, in a worker thread -- and only then yields it. So each notification is
yielded exactly once across every consumer of the inbox, in this process and, through the
journal, after a restart (``Notifier.restore_loop`` seeds only unconsumed ones). A consumer
that is cancelled while waiting loses nothing; one that fails to mark it gives it back.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

import anyio
from anyio import to_thread

from procledger.aio.wakeup import Wakeup
from procledger.domain.notification import Notification
from procledger.notifications.inbox import LoopInbox

__all__ = ["notifications"]


async def notifications(inbox: LoopInbox) -> AsyncGenerator[Notification, None]:
    """Each notification of ``inbox`` as it arrives, consumed, for ever (break to stop).

    Raises:
        StoreError: marking one consumed failed; it is pending again for the next consumer.
    """
    wakeup = Wakeup()
    unsubscribe = inbox.subscribe(wakeup.set)
    try:
        while True:
            taken = inbox.take()
            if taken is None:
                await wakeup.wait()
                continue
            await _consume(inbox, taken)
            yield taken
    finally:
        unsubscribe()
        wakeup.close()


async def _consume(inbox: LoopInbox, taken: Notification) -> None:
    """Mark ``taken`` consumed; shielded, so a cancellation cannot separate the mark from the
    hand-over (the caller yields it next, with no checkpoint in between)."""
    with anyio.CancelScope(shield=True):
        try:
            await to_thread.run_sync(inbox.consume, taken.command_id)
        except BaseException:
            inbox.give_back(taken)
            raise
