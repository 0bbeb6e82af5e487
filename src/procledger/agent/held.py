"""Runs a (re)started agent holds without being their parent (docs/design.md §18.4).

A child adopted after an agent died is the anchor's child, not ours: we cannot wait for it.
We hold it by a pidfd (readable once it ends, whoever its parent is) and learn *how* it ended
from the anchor's exit journal, where the anchor wrote ``(pid, start time, status)`` before it
reaped it. Identity is pid and start time, never a pid alone. If the anchor is gone too
(children re-parented to init), nobody can say how it ended: it is recorded ``lost`` with a
diagnostic that says the exit status is unknown and why -- never a guessed code.

Everything else about a held run is as for one this agent spawned: its lease is renewed, a stop
request on record is carried out (its tree signalled by its recorded identity), its output
files are kept within their bound, and its terminal goes through the one ``TerminalWriter``
path (outbox first) and its notification through the ``Publisher``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import threading
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from procledger.adapters.direct_output import stream_paths
from procledger.agent.adoption import Adopted
from procledger.agent.exit_journal import ExitRecord, compact, read_exits
from procledger.application.lease_keeper import LeaseKeeper, Renewal
from procledger.domain.diagnostics import clip_diagnostic
from procledger.domain.records import ProcessRecord
from procledger.domain.vocabulary import TerminalReason
from procledger.supervisor import orphans
from procledger.supervisor.decide import event_ids, outcome, request_policy
from procledger.supervisor.execution import StopPolicy
from procledger.supervisor.file_capture import FileCapture
from procledger.supervisor.orphans import OrphanStop
from procledger.supervisor.publishing import Publisher
from procledger.supervisor.runs import Ticket
from procledger.supervisor.terminals import TerminalWriter
from procledger.supervisor.wiring import output_facts

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = ["ExitWatch", "HeldRun", "Holder"]

log = logging.getLogger("procledger.agent")

JOURNAL_WAIT_S = 2.0
"""How long an ended held child's record may take to reach the journal while the anchor lives
(it writes it before reaping, within milliseconds): past this, the status is unknown."""


HELD_POLICY = StopPolicy((signal.SIGTERM,), 10.0)
"""How a held run's tree is stopped: its own ``--stop-signal``/``--grace`` are not in the
ledger, so an adopted run is stopped as ``stop``'s default stops one (SIGTERM, 10 s, SIGKILL)."""


@dataclass(slots=True)
class HeldRun:
    """One adopted child and what its writes are addressed with."""

    record: ProcessRecord
    child: Adopted | None
    ticket: Ticket
    keeper: LeaseKeeper
    policy: StopPolicy = HELD_POLICY
    seen_change_seq: int = 0
    acted_on: set[TerminalReason] = field(default_factory=set)
    shutdown: bool = False  # ``agent stop --stop-children`` stopped it
    stopped: OrphanStop | None = None  # how our own stop of its tree went, once it returned
    stopping: threading.Event = field(default_factory=threading.Event)  # set: none under way
    requested: bool = False  # a stop of ours began (``stopping`` then says when it returned)
    anchored: bool = True  # its parent is our anchor, which journals its exit (else: init)

    def stop_tree(self, signals: tuple[int, ...], grace_s: float) -> None:
        """Stop the tree by its recorded identity (``orphans.stop_tree``) and keep how it
        went: with nobody to journal the child's exit (its parent is init), the signal it died
        after is all anyone can know of how it ended."""
        self.requested = True
        try:
            self.stopped = orphans.stop_tree(self.record, signals, grace_s, escalate=True)
        finally:
            self.stopping.set()

    @property
    def process_id(self) -> str:
        return self.record.id


class ExitWatch:
    """The exit journal as this agent reads it: records past ``offset``, kept by identity until
    a held run claims its own."""

    def __init__(self, journal: Path, offset: int = 0) -> None:
        self.journal = journal
        self.offset = offset
        self._exits: dict[tuple[int, int | None], ExitRecord] = {}
        self._lock = threading.Lock()  # read from the loop's worker threads

    def read(self) -> None:
        """Take in what the anchor appended since the last read (a missing journal: none)."""
        with self._lock:
            try:
                records, self.offset = read_exits(self.journal, self.offset)
            except FileNotFoundError:
                return
            for record in records:
                if not record.agent:
                    self._exits[(record.pid, record.start_time)] = record

    def take(self, pid: int, start_time: int) -> ExitRecord | None:
        """The exit of the process ``(pid, start_time)``, once (it is forgotten here)."""
        with self._lock:
            return self._exits.pop((pid, start_time), None)

    def forget_unclaimed(self, held: Collection[tuple[int, int | None]] = ()) -> None:
        """Exits nobody held (a descendant that re-parented to the anchor, a run already on
        record): not ledger facts. The journal's sealed segments read so far go with them.
        Those of ``held`` (pid, start time) stay: a held child that ended after a read its
        end will look for."""
        with self._lock:
            kept = {key: self._exits[key] for key in held if key in self._exits}
            self._exits = kept
            with contextlib.suppress(OSError):
                compact(self.journal, self.offset)


def anchor_alive(anchor_pid: int | None) -> bool:
    """Whether the anchor that started us still is our parent (else exits go unjournaled)."""
    return anchor_pid is not None and os.getppid() == anchor_pid


class Holder:
    """The held runs' writes: their terminals and the stops asked of them."""

    def __init__(
        self,
        registry: ProcessRegistry,
        writer: TerminalWriter,
        publisher: Publisher,
        exits: ExitWatch,
    ) -> None:
        self._registry, self._writer, self._publisher = registry, writer, publisher
        self.exits = exits

    def terminal(self, held: HeldRun, exit: ExitRecord | None, why_unknown: str) -> None:
        """Record how ``held`` ended: from its journaled exit (through the outbox, as any
        terminal), else ``lost`` saying why the status is unknown; then notify."""
        ticket = held.ticket
        inferred = _after_our_stop(held) if exit is None else None
        if exit is not None or inferred is not None:
            requested = tuple(held.record.stop_requested)
            code = exit.returncode if exit is not None else inferred
            assert code is not None
            result = outcome(code, requested=requested, shutdown=held.shutdown)
            record = self._writer.record(ticket, held.keeper, result)
        else:
            output, tails = output_facts(ticket.capture)
            record = self._registry.record_lost(
                held.process_id,
                diagnostic=clip_diagnostic(why_unknown),
                event_id=ticket.ids.lost,
                lease=held.keeper.lease,
                output=output,
                tails=tails,
            )
        if held.child is not None:
            held.child.close()
        if record is not None and ticket.handle:
            self._publisher.publish(ticket.ids.command_id, ticket.handle, ticket.notify_to, record)

    def renew(self, held: HeldRun, now: float) -> bool:
        """Renew ``held``'s lease when due; False once it was lost (another holder now)."""
        if not held.keeper.is_due(now):
            return True
        return held.keeper.renew(now) is not Renewal.lost

    def stop_found(self, held: HeldRun) -> None:
        """Carry out each stop request on record not yet acted on: signal the tree by its
        recorded identity (the child's exit, seen by its pidfd, then records the terminal)."""
        record = self._registry.get(held.process_id)
        held.record = record
        for reason in record.stop_requested:
            if reason in held.acted_on:
                continue
            held.acted_on.add(reason)
            policy = request_policy(reason, held.policy)
            # waits out the grace: on a thread of its own, not the round's
            stop = functools.partial(held.stop_tree, policy.signals, policy.grace_s)
            threading.Thread(target=stop, name="procledger-held-stop", daemon=True).start()


def _after_our_stop(held: HeldRun) -> int | None:
    """A held child's return code as our own stop of its tree saw it end (minus the signal it
    died after), once that stop returned; ``None`` when we did not stop it, or saw no death.
    Its parent being init, nobody could wait for its status: the signal it died after is what
    is known, as when `stop` stops an orphan itself (``orphans.stop_orphan``)."""
    if not held.requested:
        return None
    held.stopping.wait(held.policy.grace_s + 5.0)
    stopped = held.stopped
    return None if stopped is None or stopped.ended_by is None else -stopped.ended_by


def ticket_for(
    registry: ProcessRegistry, record: ProcessRecord, capture: FileCapture | None
) -> Ticket:
    """The ticket a held run's writes go by: its ids, and the handle and notification target
    its start saved (none saved: no notification was asked for)."""
    ids = event_ids(record.id, record.registration_hash)
    row = registry.handle_row(record.id)
    handle = row.handle if row is not None else ""
    notify_to = None
    if row is not None and row.session_id is not None and row.loop_id is not None:
        notify_to = (row.session_id, row.loop_id)
    return Ticket(handle, record.id, ids, notify_to, record.registration_hash, capture)


def held_capture(folder: Path | None, limit: int | None, host_id: str | None) -> FileCapture | None:
    """The capture of an adopted run: its files, as its spawn left them (``limit`` None when
    not known: nothing is dropped then, and the summary says the limit is unknown); ``None``
    when it has none (started without capture)."""
    if folder is None or not all(path.exists() for path in stream_paths(folder)):
        return None
    return FileCapture(folder, limit, host_id)


def unknown_status(anchor_gone: bool) -> str:
    """Why a held child's exit status is unknown."""
    if anchor_gone:
        return (
            "its parent was init, not the anchor (the agent and its anchor were both gone when "
            "it was orphaned): nobody could wait for it, so its exit status is unknown"
        )
    return (
        f"its exit was not in the anchor's journal within {JOURNAL_WAIT_S:g} s of its end: "
        "its exit status is unknown"
    )
