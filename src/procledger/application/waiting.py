"""Waiting for something the ledger will say: woken by local writes, polling for others'.

A write in this process wakes waiters at once through one condition; writes by other
processes (or other hosts on PostgreSQL) are found by polling with backoff up to 100 ms.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_FIRST_PAUSE_S = 0.005
_LONGEST_PAUSE_S = 0.1


class ChangeSignal:
    """Wakes local waiters when this process commits a write."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._waiters = 0  # how many ``wait_for`` calls are in progress (changed under the lock)
        self._listeners: tuple[Callable[[], None], ...] = ()

    def notify(self) -> None:
        """Tell waiters a write committed. A waiter counts itself in before its first look, so
        one that this skips looks after the write committed; writers nobody waits for never
        touch the lock. Listeners are called on the writer's thread."""
        if self._waiters:
            with self._changed:
                self._changed.notify_all()
        for listener in self._listeners:
            listener()

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` (quick, never raising) after each local commit, from now until
        the returned function is called. For waiters that cannot block on the condition (an
        event loop); they must look after subscribing, as ``wait_for`` does."""
        with self._changed:
            self._listeners = (*self._listeners, listener)

        def unsubscribe() -> None:
            with self._changed:
                self._listeners = tuple(f for f in self._listeners if f is not listener)

        return unsubscribe

    def wait_for(self, find: Callable[[], T | None], timeout: float | None, what: str) -> T:
        """The first non-``None`` result of ``find()``, re-checked on every local write and
        polled with backoff for other processes' writes.

        Raises:
            TimeoutError: nothing was found within ``timeout`` seconds (``what`` names it).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = _FIRST_PAUSE_S
        with self._changed:
            self._waiters += 1
        try:
            while True:
                with self._changed:
                    found = find()
                    if found is not None:
                        return found
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise TimeoutError(f"timed out waiting for {what}")
                    self._changed.wait(pause if remaining is None else min(pause, remaining))
                pause = min(pause * 2, _LONGEST_PAUSE_S)
        finally:
            with self._changed:
                self._waiters -= 1
