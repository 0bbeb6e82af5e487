"""How a worker is stopped from another thread: one flag for its passes, and one cancel event
per running attempt, so that ``RecoveryWorker.stop`` reaches every runner (docs/design.md §3.6).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Cancels"]


class Cancels:
    """The worker's stop flag and the cancel events of the attempts running under it.

    ``stop`` sets them all under a lock that ``scope`` also takes, so an attempt is either
    cancelled by ``stop`` or begins cancelled: none starts running after the worker stopped.
    """

    def __init__(self) -> None:
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._cancels: set[threading.Event] = set()

    @property
    def stopping(self) -> bool:
        """Whether ``stop`` was called."""
        return self._stopping.is_set()

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for ``stop``; whether it was called."""
        return self._stopping.wait(timeout_s)

    def stop(self) -> None:
        """Set the flag and cancel every running attempt (not from a signal handler, which
        could deadlock on the lock)."""
        self._stopping.set()
        with self._lock:
            for cancel in self._cancels:
                cancel.set()

    @contextmanager
    def scope(self) -> Iterator[threading.Event]:
        """One attempt's cancel event, set by ``stop`` while the ``with`` lasts."""
        cancel = threading.Event()
        with self._lock:
            self._cancels.add(cancel)
            if self._stopping.is_set():
                cancel.set()
        try:
            yield cancel
        finally:
            with self._lock:
                self._cancels.discard(cancel)
