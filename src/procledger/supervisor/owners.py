"""Owner threads, kept for the next run (docs/design.md §6.2).

Each supervised child has one owner thread from its spawn on: it pumps the child's pipes, waits
for it, records its one terminal and notifies. Starting a thread per run cost more than the
run's whole registration on a 2-CPU machine (``Thread.start`` waits until the new thread is
scheduled; a busy machine makes that wait long), so a thread whose run has ended waits a
moment for the next one instead of ending. A thread never runs two children at once: a run
handed over while every kept thread is busy gets a new thread.

A kept thread ends after ``LINGER_S`` without work, and ``close`` ends them all (the
Supervisor's ``shutdown``), so no thread outlives the supervisor that made it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Final

__all__ = ["LINGER_S", "HelperThreads", "OwnerThreads"]

LINGER_S: Final = 2.0
"""How long a thread whose run ended waits for another before it ends."""

Job = Callable[[], None]
_Work = tuple[Job, str]  # a job and the name its thread takes while it runs


class OwnerThreads:
    """Runs each job on a thread of its own for the job's whole length; threads are reused."""

    def __init__(self, linger_s: float = LINGER_S) -> None:
        self._linger_s = linger_s
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[_Work | None]] = []  # one inbox per waiting thread
        self._threads: set[threading.Thread] = set()
        self._closed = False

    def run(self, job: Job, name: str) -> None:
        """Run ``job`` now on a kept thread that is waiting, or on a new one."""
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
            if inbox is None:
                thread = threading.Thread(target=self._serve, args=(job,), name=name, daemon=True)
                self._threads.add(thread)
        if inbox is not None:
            inbox.put((job, name))
            return
        thread.start()

    def close(self) -> None:
        """Let every thread finish its job, end the waiting ones, and join them all."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            threads = list(self._threads)
        for inbox in idle:
            inbox.put(None)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join()

    def _serve(self, job: Job) -> None:
        inbox: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        current = threading.current_thread()
        try:
            while True:
                job()
                work = self._next(inbox)
                if work is None:
                    return
                job, current.name = work
        finally:
            with self._lock:
                self._threads.discard(current)

    def _next(self, inbox: queue.SimpleQueue[_Work | None]) -> _Work | None:
        """The next job handed to this thread, or ``None``: closed, or idle too long."""
        with self._lock:
            if self._closed:
                return None
            self._idle.append(inbox)
        try:
            return inbox.get(timeout=self._linger_s)
        except queue.Empty:
            pass
        with self._lock:
            if inbox in self._idle:  # nobody took this thread meanwhile: it ends
                self._idle.remove(inbox)
                return None
        return inbox.get()  # a job was handed over just as the wait ended


class HelperThreads:
    """Short jobs that must not block their caller -- carrying out a stop, watching probes,
    running a service -- each on a thread of its own, all joined by ``join`` (the Supervisor's
    ``shutdown``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self, job: Callable[[], object], name: str = "procledger-stopper") -> None:
        thread = threading.Thread(target=job, name=name, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def join(self) -> None:
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join()
