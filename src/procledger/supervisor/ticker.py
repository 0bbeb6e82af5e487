"""The ticker: one thread per supervisor, alive while it has running processes
(docs/design.md §3.5, §6.2).

It keeps each run's lease with its ``LeaseKeeper`` (every ``renew_ms``, sooner after a store
failure; a refused renewal kills the tree) and, twice a second, notices ``stop_requested``
events written by others (``registry.request_stop``, ``procledger stop``) and hands them to the
``Stopper``. Unlike a recovery attempt, a supervised run does not fence itself off by its local
clock: only the store's refusal ends it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from procledger.application.lease_keeper import Renewal
from procledger.supervisor.runs import Run
from procledger.supervisor.stopper import Stopper

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = ["STOP_POLL_S", "Ticker"]

log = logging.getLogger("procledger.supervisor")

STOP_POLL_S: Final = 0.5
"""How often the ticker looks for stop requests made elsewhere (the contract says within 1 s)."""


class Ticker:
    """The ticker thread, started when a run is admitted and none runs; it retires once
    ``runs()`` says there is nothing to keep. Its state is guarded by the supervisor's lock."""

    def __init__(
        self,
        registry: ProcessRegistry,
        stopper: Stopper,
        lock: threading.Condition,
        runs: Callable[[], list[Run] | None],
    ) -> None:
        self._registry, self._stopper = registry, stopper
        self._lock, self._runs = lock, runs
        self._thread: threading.Thread | None = None
        self._until = 0.0  # when the ticker wakes up next (monotonic)
        self._wake = threading.Event()
        self._poll_asked = False
        self._seen_latest = -1  # the ledger's newest change position at the last poll

    def admitted(self, run: Run) -> bool:
        """(Under the lock.) Start the ticker if none runs; True if it must be woken for
        ``run``: only if this lease is due before its next wake-up (a wake-up per run cost a
        thread switch per run). A new run is asked about at the next poll whatever else
        changed: a stop requested before it was admitted is on its record already."""
        self._seen_latest = -1
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._tick, name="procledger-supervisor-ticker", daemon=True
            )
            self._until = math.inf
            self._thread.start()
        return run.keeper.due_at < self._until

    def wake(self) -> None:
        self._wake.set()

    def poll_now(self) -> None:
        """Look for stop requests at once rather than at the next poll: someone just recorded
        one (a `stop` that tells the host agent, a PostgreSQL notification)."""
        self._poll_asked = True
        self._wake.set()

    def join(self) -> None:
        """Wake the ticker and wait for it to retire (the caller saw to it that it will)."""
        self._wake.set()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join()

    def _tick(self) -> None:
        """Renew each run's lease when due, and poll for stop requests made elsewhere; until
        no run is active and none is starting."""
        next_poll = time.monotonic() + STOP_POLL_S
        while (runs := self._ticking()) is not None:
            now = time.monotonic()
            for run in runs:
                self._renew_if_due(run, now)
            if now >= next_poll or self._poll_asked:
                self._poll_asked = False
                self._poll_stop_requests(runs)
                next_poll = now + STOP_POLL_S
            self._wake.wait(self._sleep(runs, next_poll))
            self._wake.clear()

    def _ticking(self) -> list[Run] | None:
        """The active runs; ``None`` (and the ticker retired) once there is nothing to keep."""
        with self._lock:
            runs = self._runs()
            if runs is None:
                self._thread = None
                return None
            self._until = math.inf  # awake: a run admitted from now on wakes it
            return runs

    def _sleep(self, runs: list[Run], next_poll: float) -> float:
        """How long the ticker sleeps now: until the next renewal or poll is due."""
        now = time.monotonic()
        due = min((run.keeper.due_at for run in runs if run.renewing), default=next_poll)
        sleep_s = max(0.0, min(next_poll, due) - now)
        with self._lock:
            self._until = now + sleep_s
        return sleep_s

    def _renew_if_due(self, run: Run, now: float) -> None:
        if not (run.renewing and run.keeper.is_due(now)):
            return
        if run.keeper.renew(now) is Renewal.lost:
            self._stopper.lease_lost(run)

    def _poll_stop_requests(self, runs: list[Run]) -> None:
        """Runs whose record changed since the last look get their stop requests read. The
        ledger's newest change position is read first (one indexed read): when nothing changed
        anywhere, the runs are not asked about one by one (a thousand idle runs polled twice a
        second cost a core's 1% for nothing)."""
        try:
            latest = self._registry.latest_change_seq()
            if latest == self._seen_latest:
                return
            seqs = self._registry.change_seqs([r.process_id for r in runs])
        except Exception as error:
            log.info("polling stop requests failed: %s", error)  # a store outage: not news
            return
        self._seen_latest = latest
        for run in runs:
            seq = seqs.get(run.process_id, 0)
            if seq > run.seen_change_seq and not run.ended:
                self._stopper.take_found(run, seq)
