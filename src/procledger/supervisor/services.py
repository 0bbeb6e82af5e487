"""A supervised service: one command started again, as new attempts, by its restart policy
(docs/design.md §15).

Each attempt is its own process in the ledger -- its own id (``<first id>.<n>``), lifecycle and
lease -- linked to the first by ``attempt_of`` and numbered by ``attempt``; the closed table is
the same for every one. The ``Supervisor`` runs one **service thread** per service: it waits for
the current attempt's terminal, asks ``plan_restart`` what follows, and either stops, gives up
(the ``crash_loop`` fact on the last attempt) or registers the next attempt, holds its lease
through the backoff wait (``backoff_wait``) and spawns it. The next attempt is registered
*before* the wait, ``starting``, so a stop of the service during the wait -- this supervisor's
``stop``, or ``procledger stop`` from elsewhere, which finds the newest attempt -- has a process
to record it on: that attempt ends ``terminated`` without ever running.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from enum import Enum
from typing import Any, Final

from procledger.domain.records import ProcessRecord
from procledger.domain.service import RestartPolicy

__all__ = ["BackoffEnd", "Service", "backoff_wait"]

STOP_POLL_S: Final = 0.5
"""How often a backoff wait looks for a stop request recorded elsewhere."""


class Service:
    """What the supervisor knows of one service; ``lock`` orders a stop against a launch, so a
    stop never misses an attempt that was starting."""

    def __init__(self, handle: str, first_id: str, policy: RestartPolicy, template: Any) -> None:
        self.handle = handle
        self.first_id = first_id
        self.policy = policy
        self.template = template  # the first attempt's start request
        self.current: Any = None  # the run of the newest attempt
        self.attempts: list[str] = [first_id]
        self.lock = threading.Lock()
        self.cancelled = threading.Event()  # stopped, or the supervisor shuts down
        self.done = threading.Event()  # no attempt will start again
        self.wake = threading.Event()  # an attempt became ready or ended, or the service is done
        self.record: ProcessRecord | None = None  # the newest attempt's terminal record
        self.error: BaseException | None = None
        self.rng = random.Random()


class BackoffEnd(Enum):
    """How a backoff wait ended."""

    go = "go"  # the delay passed: start the attempt
    stop = "stop"  # the service was stopped (here or by a request on record)
    lost = "lost"  # the pending attempt's lease was lost: its new holder decides


def backoff_wait(
    delay_s: float,
    *,
    cancelled: threading.Event,
    stop_requested: Callable[[], bool],
    renew_due: Callable[[float], float | None],
) -> BackoffEnd:
    """Wait ``delay_s`` seconds unless ``cancelled`` is set or ``stop_requested()`` (asked
    every ``STOP_POLL_S``) says so; ``renew_due(now)`` keeps the pending attempt's lease and
    returns when it is next due, or ``None`` if the lease was lost."""
    start = time.monotonic()
    deadline, next_poll = start + delay_s, start
    while True:
        now = time.monotonic()
        if cancelled.is_set():
            return BackoffEnd.stop
        if now >= next_poll:
            if stop_requested():
                return BackoffEnd.stop
            next_poll = now + STOP_POLL_S
        due = renew_due(now)
        if due is None:
            return BackoffEnd.lost
        if now >= deadline:
            return BackoffEnd.go
        cancelled.wait(max(0.0, min(deadline, next_poll, due) - now))
