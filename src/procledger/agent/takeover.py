"""What a (re)started agent does before it serves anyone (docs/design.md §18.4, steps 1-3).

1. **The outbox**: outcomes a dead agent knew but had not recorded are recorded as they were.
2. **The exit journal**: each process of this ledger that an earlier agent of this host held,
   and that ended while the anchor lived, is recorded from the anchor's record of it -- matched
   by pid *and* start time, so a pid reused by another process is never mistaken for it.
3. **Adoption**: each such process still running is held again -- pid, ``/proc`` start time
   and the run's marker in its environment must all agree before a pidfd pins it. A process
   recorded ``starting`` (its agent died between the spawn and the write that records the
   child) is looked for by its run marker. What can be neither found nor journaled ended
   unseen: it is recorded ``lost`` with a diagnostic saying so, never a guessed status.

Only processes whose lease an earlier agent of this ledger on this host held, and whose holder
is gone, are touched: a live holder (a foreground ``run``, another host's agent) is never taken
over.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from procledger.agent.adoption import NotAdoptable, adopt, parent_of
from procledger.agent.exit_journal import ExitRecord
from procledger.agent.held import (
    JOURNAL_WAIT_S,
    HeldRun,
    Holder,
    held_capture,
    ticket_for,
    unknown_status,
)
from procledger.application.lease_keeper import LeaseKeeper
from procledger.application.outbox import deliver_outbox, this_host_id
from procledger.domain.errors import InvalidTransition, LeaseLost, NotFound
from procledger.domain.leases import Lease, LeaseOwner, LeaseTimings
from procledger.domain.records import OsFacts, ProcessRecord
from procledger.domain.vocabulary import ProcessState
from procledger.supervisor import orphans, os_seam
from procledger.supervisor.decide import event_ids
from procledger.supervisor.file_capture import recorded_limit
from procledger.supervisor.publishing import Publisher
from procledger.supervisor.terminals import TerminalWriter

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = ["Takeover", "TakeoverReport"]

log = logging.getLogger("procledger.agent")

FolderOf = Callable[[str], Path | None]
"""Where a process's output files are on this host (``None``: an in-memory ledger's)."""

TAKEOVER_THREADS = 4
"""Processes taken over at once: each is a lease taken (a durable commit) and a terminal or an
adoption; a thousand one after another took 2.3 s, and the store commits a few together."""

Taken = HeldRun | Literal["journaled", "lost"] | None
"""What became of one process at the takeover."""

NEVER_RAN = (
    "its agent died while starting it and no process carries its run marker: "
    "it never ran, or ended unseen; its exit status is unknown"
)


@dataclass(slots=True)
class TakeoverReport:
    """What the takeover did: outcomes delivered, exits recorded, runs held, runs lost."""

    delivered: int = 0
    journaled: int = 0
    lost: int = 0
    held: list[HeldRun] = field(default_factory=list)
    seconds: float = 0.0


class Takeover:
    """Steps 1-3 of the module docstring, as ``owner`` (this agent's incarnation)."""

    def __init__(
        self,
        registry: ProcessRegistry,
        owner: LeaseOwner,
        timings: LeaseTimings,
        parts: tuple[TerminalWriter, Publisher, Holder],
        folder_of: FolderOf,
    ) -> None:
        self._registry, self._owner, self._timings = registry, owner, timings
        self._writer, self._publisher, self._holder = parts
        self._folder_of = folder_of

    def run(self, *, anchor_gone: bool) -> TakeoverReport:
        began = time.monotonic()
        report = TakeoverReport()
        outbox = self._writer.outbox()
        if outbox is not None:
            for record in deliver_outbox(self._registry, outbox, ttl_ms=self._timings.ttl_ms):
                self._publisher.publish_again(record)
                report.delivered += 1
        self._holder.exits.read()
        take = functools.partial(self._take_guarded, anchor_gone=anchor_gone)
        with ThreadPoolExecutor(TAKEOVER_THREADS, "procledger-takeover") as pool:
            for taken in pool.map(take, self._ours()):
                if isinstance(taken, HeldRun):
                    report.held.append(taken)
                elif taken == "journaled":
                    report.journaled += 1
                elif taken == "lost":
                    report.lost += 1
        held = [(h.child.pid, h.child.start_time) for h in report.held if h.child is not None]
        self._holder.exits.forget_unclaimed(held)
        report.seconds = time.monotonic() - began
        return report

    def _take_guarded(self, record: ProcessRecord, *, anchor_gone: bool) -> Taken:
        try:
            return self._take_one(record, anchor_gone)
        except (LeaseLost, InvalidTransition, NotFound) as error:
            log.info("process %r: not taken over: %s", record.id, error)
            return None

    def _ours(self) -> list[ProcessRecord]:
        """The unended processes an earlier agent of this ledger on this host held."""
        found = []
        for record in self._registry.list_processes({"status": "running"}):
            lease = self._registry.get_lease(record.id)
            holder = lease.owner if lease is not None else None
            if holder is None and record.first_started is not None:
                holder = record.first_started.owner
            mine = holder is not None and holder.owner_id == self._owner.owner_id
            if mine and holder is not None and not holder.same_incarnation(self._owner):
                found.append(record)
        return found

    def _take_one(self, record: ProcessRecord, anchor_gone: bool) -> Taken:
        """One process taken over: held, recorded from the journal, or recorded lost (None:
        its holder may live, it is not ours to take)."""
        lease = self._lease(record)
        if lease is None:
            return None
        keeper = LeaseKeeper(self._registry, lease, self._timings, since=time.monotonic(), log=log)
        if record.state is ProcessState.starting:
            record = self._found_starting(record, keeper)
        folder = self._folder_of(record.id)
        limit = None if folder is None else recorded_limit(folder)
        capture = held_capture(folder, limit, this_host_id())
        held = HeldRun(record, None, ticket_for(self._registry, record, capture), keeper)
        facts = record.os
        if facts is None:
            self._holder.terminal(held, None, NEVER_RAN)
            return "lost"
        exit = self._holder.exits.take(facts.pid, int(facts.start_time))
        if exit is not None:
            self._holder.terminal(held, exit, "")
            return "journaled"
        adopted = adopt(_Recorded(facts), held.ticket.ids.run_marker)
        if isinstance(adopted, NotAdoptable):
            exit = self._ended_meanwhile(facts, anchor_gone)
            if exit is not None:
                self._holder.terminal(held, exit, "")
                return "journaled"
            self._holder.terminal(held, None, f"{unknown_status(anchor_gone)} ({adopted.detail})")
            return "lost"
        held.child = adopted
        held.anchored = parent_of(facts.pid, int(facts.start_time)) == os.getppid()
        return held

    def _ended_meanwhile(self, facts: OsFacts, anchor_gone: bool) -> ExitRecord | None:
        """The exit of a child that ended after the journal was read, while this takeover ran
        (refused as gone, a zombie, or with an environment that no longer reads). The anchor
        writes a record before it reaps: it is in the journal now, or soon while the child is
        still the anchor's (waited for up to ``JOURNAL_WAIT_S``)."""
        exits, key = self._holder.exits, (facts.pid, int(facts.start_time))
        deadline = time.monotonic() + JOURNAL_WAIT_S
        pause = 0.005
        while True:
            # Asked before the read: a reap after it leaves its record for the read.
            anchors = not anchor_gone and parent_of(*key) == os.getppid()
            exits.read()
            exit = exits.take(*key)
            if exit is not None or not anchors or time.monotonic() >= deadline:
                return exit
            time.sleep(pause)  # the anchor's fsync: nothing here can wait on it
            pause = min(pause * 2, 0.1)

    def _lease(self, record: ProcessRecord) -> Lease | None:
        try:
            return orphans.take_over(self._registry, record, self._owner, self._timings.ttl_ms)
        except (InvalidTransition, NotFound):  # it ended, or was pruned, since we looked
            return None

    def _found_starting(self, record: ProcessRecord, keeper: LeaseKeeper) -> ProcessRecord:
        """A ``starting`` process: its agent died after registering it, perhaps after spawning
        it. A process carrying its run's marker and leading its own group is its child: it is
        recorded running, as its start would have recorded it."""
        ids = event_ids(record.id, record.registration_hash)
        leaders = [pid for pid in os_seam.carrying(ids.run_marker) if _leads_group(pid)]
        host = this_host_id()
        stat = os_seam.proc_stat(leaders[0]) if leaders else None
        if host is None or stat is None:
            return record
        facts = OsFacts(pid=leaders[0], pgid=leaders[0], start_time=stat[1], host_id=host)
        registry = self._registry
        write = registry.running_write(
            record.id, registry.now_ms(), background=True, event_id=ids.backgrounded, os=facts
        )
        return registry.make(write)


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except OSError:
        return False


class _Recorded:
    """``adoption.Recorded`` of a record's OS facts."""

    __slots__ = ("host_id", "pid", "start_time")

    def __init__(self, facts: OsFacts) -> None:
        self.pid, self.start_time, self.host_id = facts.pid, facts.start_time, facts.host_id
