"""One supervised child's run, from its spawn to its recorded terminal (docs/design.md §6.2).

A ``Run`` is shared by its owner thread, the ticker, stoppers and the readiness watch. It owns
its state and every transition of it, under its own lock, so that the facts which decide the
terminal -- the stops asked for, a shutdown, a lost lease, a ready timeout -- are noted before
the child's end or not at all: once the run has ``ended`` it takes no more, and nothing may be
signalled (the child's pid may be reused).

The ``RunTable`` is the supervisor's index of its runs by handle: the active ones, the finished
ones kept whole, and the older ones shrunk to an ``Ended``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Final, NamedTuple, final

from procledger.application.lease_keeper import LeaseKeeper
from procledger.domain.errors import NotFound
from procledger.domain.records import ProcessRecord
from procledger.domain.vocabulary import TerminalReason
from procledger.supervisor.decide import EventIds, Outcome, outcome
from procledger.supervisor.execution import OwnedChild
from procledger.supervisor.readiness import ReadinessWatch
from procledger.supervisor.requests import NotifyTo
from procledger.supervisor.wiring import Kept

__all__ = [
    "FINISHED_KEPT",
    "Ended",
    "Prepared",
    "ProcessHandle",
    "Run",
    "RunTable",
    "Ticket",
]

FINISHED_KEPT: Final = 1_024
"""Finished runs a supervisor keeps whole; older ones shrink to an ``Ended``."""


@final
@dataclass(frozen=True, slots=True)
class ProcessHandle:
    """What ``start`` returns: the opaque ``handle`` (22 URL-safe characters that encode
    nothing, so it can be handed to an agent or a log without leaking a pid or a path) and the
    ``process_id`` in the ledger. Pass either the handle or this object to ``wait``/``stop``."""

    handle: str
    process_id: str


@dataclass(frozen=True, slots=True)
class Ticket:
    """A registered, leased process about to be spawned: what its writes and its completion
    notification are addressed with."""

    handle: str
    process_id: str
    ids: EventIds
    notify_to: NotifyTo | None
    registration_hash: str
    capture: Kept | None = None


class Prepared(NamedTuple):
    """A process registered, leased and stamped, not yet spawned."""

    ticket: Ticket
    keeper: LeaseKeeper
    workdir: str


class Run:
    """One supervised process from spawn to terminal. ``lock`` guards the fields that decide
    the terminal; the methods below are the only transitions of them."""

    def __init__(
        self,
        prepared: Prepared,
        child: OwnedChild,
        watch: ReadinessWatch | None = None,
    ) -> None:
        self.ticket, self.keeper, self.child, self.watch = (
            prepared.ticket,
            prepared.keeper,
            child,
            watch,
        )
        self.lock = threading.Lock()
        self.claimed: set[TerminalReason] = set()  # stop reasons someone here acts on
        self.requested: list[TerminalReason] = []  # durable stop requests, for the outcome
        self.shutdown = self.ended = self.lease_lost = self.ready = False
        self.returncode: int | None = None
        self.ready_timeout: str | None = None  # why the probes failed; the tree was stopped
        self.seen_change_seq = 0
        self.done = threading.Event()  # the terminal is recorded (or could not be)
        self.settled = threading.Event()  # ready, or ended: what ``wait_ready`` waits for
        self.record: ProcessRecord | None = None
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.spawned_at = time.monotonic()
        self.ready_at: float | None = None
        self.wakes: threading.Event | None = None  # set once ready: its service's ``wake``

    @property
    def handle(self) -> str:
        return self.ticket.handle

    @property
    def process_id(self) -> str:
        return self.ticket.process_id

    @property
    def ids(self) -> EventIds:
        return self.ticket.ids

    @property
    def notify_to(self) -> NotifyTo | None:
        return self.ticket.notify_to

    @property
    def renewing(self) -> bool:
        """Whether the ticker still keeps this run's lease (read without the lock: a stale
        answer costs one renewal more or less)."""
        return not (self.ended or self.lease_lost)

    @property
    def process_handle(self) -> ProcessHandle:
        return ProcessHandle(self.handle, self.process_id)

    def claim(self, reason: TerminalReason) -> bool:
        """Note that someone here acts on a stop for ``reason``; False once the run has
        ended (nothing may be signalled then)."""
        with self.lock:
            if self.ended:
                return False
            self.claimed.add(reason)
            return True

    def claim_found(self, reason: TerminalReason) -> bool:
        """A stop request found on record: True if nobody here acts on it yet (now they do)."""
        with self.lock:
            new = reason not in self.claimed
            self.claimed.add(reason)
            return new

    def note_requested(self, reason: TerminalReason) -> bool:
        """A durable stop request the outcome must name; False once the run has ended."""
        with self.lock:
            if self.ended:
                return False
            if reason not in self.requested:
                self.requested.append(reason)
            return True

    def mark_shutdown(self) -> None:
        """The run ends by the supervisor's shutdown, however its child then ends."""
        with self.lock:
            if not self.ended:
                self.shutdown = True

    def mark_lease_lost(self) -> bool:
        """Another holder owns the process now; False if the run had ended already."""
        with self.lock:
            if self.ended:
                return False
            self.lease_lost = True
            return True

    def mark_ready(self) -> None:
        with self.lock:
            self.ready, self.ready_at = True, time.monotonic()
        self.settled.set()
        if self.wakes is not None:
            self.wakes.set()

    def mark_ready_timeout(self, why: str) -> bool:
        """The probes did not hold in time; False if the run had ended already."""
        with self.lock:
            if self.ended:
                return False
            self.ready_timeout = why
            return True

    def end(self, returncode: int, failure: str | None) -> Outcome | None:
        """The child ended: no more stops are taken. Its terminal, decided from how it ended
        and what was asked of it; ``None`` if the lease was lost (the new holder records it)."""
        with self.lock:
            self.ended, self.returncode = True, returncode
            requested, shutdown, lost = tuple(self.requested), self.shutdown, self.lease_lost
            ready_timeout = self.ready_timeout
        if lost:
            return None
        result = outcome(
            returncode,
            requested=requested,
            shutdown=shutdown,
            failure=failure,
            ready_timeout=ready_timeout,
        )
        return dataclasses.replace(result, survivors=tuple(self.child.survivors))

    def child_status(self) -> tuple[int, str | None]:
        """How the child ended (waited for if need be), and the failure that ended it: a
        consumer or a read that failed (the tree is then stopped)."""
        try:
            return self.child.wait(), None
        except Exception as error:
            returncode = self.child.returncode if self.child.returncode is not None else -9
            return returncode, f"{type(error).__name__}: {error}"

    def stopped(self) -> bool:
        """Whether anything but the child itself ended the run: a stop, a shutdown, a lost
        lease (a service never restarts after one of them)."""
        with self.lock:
            return bool(self.requested) or self.shutdown or self.lease_lost

    def healthy_since(self) -> float | None:
        """When the run became healthy (ready when probed, else spawned); monotonic."""
        with self.lock:
            return self.ready_at if self.watch is not None else self.spawned_at

    def is_up(self) -> bool:
        """Ready, or running without probes: what a service's ``wait_ready`` waits for."""
        with self.lock:
            return self.ready or (self.watch is None and not self.ended)

    def current_returncode(self) -> int | None:
        with self.lock:
            return self.returncode

    def finished(self) -> None:
        """Its terminal is recorded (or could not be): its capture's tails go, waiters wake."""
        self.ticket = dataclasses.replace(self.ticket, capture=None)
        self.done.set()
        self.settled.set()


@dataclass(frozen=True, slots=True)
class Ended:
    """What a supervisor keeps of a run that finished ``FINISHED_KEPT`` runs ago: enough to
    answer ``wait``, ``stop`` and ``returncode`` for its handle (the record is in the ledger).
    A whole ``Run`` holds about 30 KB (its records, its child, its lease keeper); a harness
    that supervises for weeks would otherwise keep every run it ever started."""

    process_id: str
    returncode: int | None


class RunTable:
    """The supervisor's runs by handle; guarded by the supervisor's lock (``lock``)."""

    def __init__(self, lock: threading.Condition) -> None:
        self.lock = lock
        self._runs: dict[str, Run] = {}
        self._active: dict[str, Run] = {}
        self._finished: deque[str] = deque()  # handles of whole finished runs, oldest first
        self._ended: dict[str, Ended] = {}

    def admit(self, run: Run) -> None:
        """(Under ``lock``.) A run whose child runs now."""
        self._runs[run.handle] = run
        self._active[run.handle] = run

    def active(self) -> list[Run]:
        """(Under ``lock``.) The runs whose terminal is not recorded yet."""
        return list(self._active.values())

    def settle(self, run: Run) -> None:
        """The run's terminal is recorded (or could not be): it leaves the active runs, and
        the oldest finished runs shrink to an ``Ended``. A run whose terminal could not be
        written stays whole: its ``wait`` must go on raising why, which the ledger cannot
        tell."""
        with self.lock:
            self._active.pop(run.handle, None)
            if run.error is None:
                self._finished.append(run.handle)
            while len(self._finished) > FINISHED_KEPT:
                old = self._runs.pop(self._finished.popleft())
                self._ended[old.handle] = Ended(old.process_id, old.returncode)
            self.lock.notify_all()
        run.finished()

    def find(self, handle: ProcessHandle | str) -> Run | Ended:
        key = handle.handle if isinstance(handle, ProcessHandle) else handle
        with self.lock:
            run = (self._runs.get(key) or self._ended.get(key)) if isinstance(key, str) else None
        if run is None:
            raise NotFound(f"process handle {key!r} not found in this supervisor")
        return run
