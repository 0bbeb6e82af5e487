"""A loop's inbox: the bounded live set that process notifications (completions and waits for
input) are dispatched into.

The inbox is also the live de-duplication guard, so a headless session (no journal) still
recognises an at-least-once retry: a command id it holds — pending, or consumed within the last
``remember`` consumptions — is a ``DUPLICATE`` (or a ``COLLISION`` when the payload differs),
and that is decided before capacity. Only ``capacity`` notifications may be pending; beyond that
the answer is ``STOPPED`` with ``DeliveryStopped`` and the caller retries later with the same
command id (the journal, when there is one, already holds it).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from procledger.domain.errors import DeliveryStopped, IdempotencyCollision, NotFound
from procledger.domain.notification import Notification
from procledger.notifications.delivery import ACCEPTED, DUPLICATE, Delivery, collision, stopped


class ConsumeSink(Protocol):
    """Where an attached inbox records consumption durably (its ``Notifier``)."""

    def record_consumed(
        self, loop_id: uuid.UUID, command_id: uuid.UUID, *, known: bool
    ) -> None: ...


class LoopInbox:
    """Accepted, not yet consumed notifications of one loop, in arrival order.

    ``capacity`` bounds the pending set; ``remember`` bounds how many consumed command ids are
    kept to recognise late retries. Thread-safe.
    """

    def __init__(self, capacity: int = 64, *, remember: int = 1024) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity}")
        if remember < 0:
            raise ValueError(f"remember must not be negative, not {remember}")
        self.capacity = capacity
        self.remember = remember
        self._cond = threading.Condition()
        self._pending: dict[uuid.UUID, Notification] = {}
        self._consumed: OrderedDict[uuid.UUID, Notification] = OrderedDict()
        self._taken: dict[uuid.UUID, Notification] = {}  # handed to one consumer by ``take``
        self._listeners: tuple[Callable[[], None], ...] = ()
        self._sink: ConsumeSink | None = None
        self._loop_id: uuid.UUID | None = None

    def __repr__(self) -> str:
        return (
            f"LoopInbox(loop_id={self._loop_id}, pending={len(self._pending)}, "
            f"capacity={self.capacity})"
        )

    @property
    def loop_id(self) -> uuid.UUID | None:
        """The loop this inbox is attached to (``None`` until ``Notifier.add_loop``)."""
        return self._loop_id

    def pending(self) -> list[Notification]:
        """Accepted, not yet consumed notifications, in arrival order."""
        with self._cond:
            return list(self._pending.values())

    def wait(self, timeout: float | None = None) -> bool:
        """Block until something is pending (``True``) or ``timeout`` seconds pass (``False``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._pending:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def take(self) -> Notification | None:
        """Hand the oldest pending notification to this caller alone (``None`` if none is
        pending): it leaves ``pending``, so a second consumer never gets it, and is still
        recognised as a duplicate. ``consume`` it, or ``give_back`` if it cannot be."""
        with self._cond:
            if not self._pending:
                return None
            cid = next(iter(self._pending))
            notification = self._taken[cid] = self._pending.pop(cid)
            return notification

    def give_back(self, notification: Notification) -> None:
        """Return a taken, unconsumed notification to ``pending`` (at the end)."""
        with self._cond:
            if self._taken.pop(notification.command_id, None) is not None:
                self._pending[notification.command_id] = notification
                self._cond.notify_all()
        self._tell_listeners()

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` (quick, never raising; on the deliverer's thread) whenever a
        notification becomes pending, until the returned function is called: how an event
        loop waits for the inbox without a thread (docs/design.md §17)."""
        with self._cond:
            self._listeners = (*self._listeners, listener)

        def unsubscribe() -> None:
            with self._cond:
                self._listeners = tuple(f for f in self._listeners if f is not listener)

        return unsubscribe

    def _tell_listeners(self) -> None:
        for listener in self._listeners:
            listener()

    def consume(self, command_id: uuid.UUID | str) -> None:
        """Mark the command handled: durably first (through the notifier's journal), then here.

        Consuming twice is harmless. ``NotFound`` when the command is neither pending here nor
        journalled for this loop.
        """
        cid = command_id if isinstance(command_id, uuid.UUID) else uuid.UUID(command_id)
        with self._cond:
            known = cid in self._pending or cid in self._consumed or cid in self._taken
        if self._sink is not None and self._loop_id is not None:
            self._sink.record_consumed(self._loop_id, cid, known=known)
        elif not known:
            raise NotFound(f"command {cid} is not pending in this inbox")
        with self._cond:
            handled = self._pending.pop(cid, None) or self._taken.pop(cid, None)
            if handled is not None:
                self._remember(handled)

    def offer(self, notification: Notification) -> Delivery:
        """Dispatch one (already validated and journalled) notification into the live set."""
        cid = notification.command_id
        with self._cond:
            known = self._pending.get(cid) or self._taken.get(cid) or self._consumed.get(cid)
            if known is not None:
                if known == notification:
                    return DUPLICATE
                return collision(
                    IdempotencyCollision(
                        f"command {cid} was delivered to loop {notification.loop_id} with "
                        "another payload: retry only with the identical notification"
                    )
                )
            if len(self._pending) >= self.capacity:
                return stopped(
                    DeliveryStopped(
                        f"loop {notification.loop_id}: inbox full ({self.capacity} pending); "
                        f"command {cid} is kept in the journal — retry later with the same id"
                    )
                )
            self._pending[cid] = notification
            self._cond.notify_all()
        self._tell_listeners()
        return ACCEPTED

    def _remember(self, notification: Notification) -> None:
        if self.remember == 0:
            return
        self._consumed[notification.command_id] = notification
        while len(self._consumed) > self.remember:
            self._consumed.popitem(last=False)

    def attach(self, sink: ConsumeSink, loop_id: uuid.UUID) -> None:
        """Called by ``Notifier.add_loop``; an inbox serves one loop of one notifier."""
        with self._cond:
            if self._sink is not None and (self._sink is not sink or self._loop_id != loop_id):
                raise ValueError(f"this inbox is already attached to loop {self._loop_id}")
            self._sink = sink
            self._loop_id = loop_id
