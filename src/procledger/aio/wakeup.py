"""A wake-up that any thread may set and an event loop (asyncio or trio) awaits without a
thread: the read end of a non-blocking pipe (docs/design.md §17)."""

from __future__ import annotations

import contextlib
import math
import os
import threading

import anyio


class Wakeup:
    """Set from any thread (a writer's commit, a notifier's delivery); awaited by one task.

    Setting it twice before a wait wakes that wait once; a set that comes before the wait is
    not lost (the byte waits in the pipe). ``close`` it when done.
    """

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._lock = threading.Lock()  # a set racing close must not write to a reused fd
        self._closed = False

    def set(self) -> None:
        """Wake the waiter (or the next one); quick and never raising, from any thread."""
        with self._lock:
            if self._closed:
                return
            with contextlib.suppress(BlockingIOError):  # full of wake-ups already
                os.write(self._write, b"\0")

    async def wait(self, timeout: float | None = None) -> bool:
        """Until set (True, and cleared) or ``timeout`` seconds passed (False)."""
        with anyio.move_on_after(math.inf if timeout is None else timeout):
            await anyio.wait_readable(self._read)
        return self._clear()

    def _clear(self) -> bool:
        woken = False
        while True:
            try:
                if not os.read(self._read, 4096):
                    return woken
            except BlockingIOError:
                return woken
            woken = True

    def close(self) -> None:
        """Release the pipe; later ``set`` calls do nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        os.close(self._write)
        os.close(self._read)
