"""The one place a supervised run's terminal is written (docs/design.md §6.2, §6.3).

Outbox first: the outcome is saved on this host before the store is asked, so a supervisor
that dies or a store that fails loses nothing (``restore`` delivers what is left). Then
``completed`` is written with the lease, which releases it in the same transaction, with the
event id derived from the registration so a retry never appends twice. A store that is
unavailable is waited out for as long as the supervisor runs; a decision of the registry (the
process ended otherwise, the lease is another's) ends the wait. Only then is the entry deleted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

from procledger.adapters.outbox import Outbox, OutboxEntry, default_outbox
from procledger.application.lease_keeper import LeaseKeeper
from procledger.application.outbox import entry_write, record_entry, store_key, this_host_id
from procledger.domain.errors import (
    InvalidTransition,
    LeaseLost,
    ProcledgerError,
    StoreError,
    StoreUnavailable,
    WriteConflict,
)
from procledger.domain.leases import Acquired, Lease, LeaseOwner, LeaseTimings
from procledger.domain.records import ProcessRecord
from procledger.supervisor.decide import Outcome
from procledger.supervisor.runs import Ticket
from procledger.supervisor.wiring import OutputFacts, output_facts

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = ["RETRY_FIRST_S", "RETRY_MAX_S", "Notice", "Terminal", "TerminalWriter"]

log = logging.getLogger("procledger.supervisor")

RETRY_FIRST_S: Final = 0.1
RETRY_MAX_S: Final = 5.0
"""A terminal write the store could not take is retried (with its stable id) for as long as
the supervisor runs: first after ``RETRY_FIRST_S``, doubling up to ``RETRY_MAX_S``."""

Notice = Callable[[str], None]
"""Receives the lines a person should see while an outcome waits for the store."""

Terminal = tuple[Ticket, LeaseKeeper, Outcome]
"""A terminal to write: the run it ends, the lease it is written with, what it says."""

_Saved = tuple[OutboxEntry, LeaseKeeper, Outbox | None]
"""A terminal saved in the outbox (``None``: there is none), ready for the store."""


class TerminalWriter:
    """Writes terminals as the module docstring says; thread-safe (it keeps no state but its
    outbox, made once)."""

    def __init__(
        self,
        registry: ProcessRegistry,
        owner: LeaseOwner,
        timings: LeaseTimings,
        outbox: Outbox | None,
        notice: Notice | None,
    ) -> None:
        self._registry, self._store = registry, store_key(registry.location)  # realpath: once
        self._owner, self._timings = owner, timings
        self._outbox, self._notice = outbox, notice

    def record(self, ticket: Ticket, keeper: LeaseKeeper, result: Outcome) -> ProcessRecord | None:
        """Write one terminal; ``None`` where another holder owns the process now (it
        records the terminal).

        Raises:
            ProcledgerError: the registry refused it for good (the entry is deleted).
            Exception: not a store failure (a bug): raised at once, the entry kept.
        """
        return self._written(self._saved(ticket, keeper, result))

    def record_all(self, terminals: Sequence[Terminal]) -> list[ProcessRecord | Exception | None]:
        """``record`` of each, the first try of all in one write (runs that ended together,
        ``Settle.together``); each its own outcome."""
        saved: list[_Saved | Exception] = []
        for terminal in terminals:
            try:
                saved.append(self._saved(*terminal))
            except Exception as error:  # handed to the run it belongs to
                saved.append(error)
        first = self._first_try([s for s in saved if not isinstance(s, Exception)])
        return [
            item if isinstance(item, Exception) else self._decided(item, first.get(id(item[0])))
            for item in saved
        ]

    def outbox(self) -> Outbox | None:
        """The outbox, or ``None`` for an in-memory store or where none can be created."""
        if self._store is None:
            return None
        if self._outbox is None:
            try:
                self._outbox = default_outbox()
            except OSError as error:
                log.warning("no outbox (outcomes wait for the store in memory only): %s", error)
                return None
        return self._outbox

    def say(self, line: str) -> None:
        """A line for the log and for whoever the supervisor tells what it waits for."""
        log.info("%s", line)
        if self._notice is not None:
            self._notice(line)

    def _first_try(self, saved: Sequence[_Saved]) -> dict[int, ProcessRecord | Exception]:
        """The first write of several terminals, made together (keyed by entry identity)."""
        leased = [(entry, keeper.lease) for entry, keeper, _ in saved if keeper.lease is not None]
        if len(saved) < 2 or not leased:
            return {}
        writes = [entry_write(self._registry, entry, lease) for entry, lease in leased]
        answers = self._registry.write_all(writes)
        return {id(entry): answer for (entry, _), answer in zip(leased, answers, strict=True)}

    def _decided(
        self, saved: _Saved, first: ProcessRecord | Exception | None
    ) -> ProcessRecord | Exception | None:
        """One terminal of several, after their first try: written, or tried alone."""
        if isinstance(first, ProcessRecord):
            self._forget(saved[2], saved[0], None)
            return first
        try:
            return self._written(saved)
        except Exception as error:  # handed to the run it belongs to
            return error

    def _written(self, saved: _Saved) -> ProcessRecord | None:
        """Write a saved terminal until the store decided, then forget its outbox entry
        (unless the store failed or the failure is a bug: then it stays for ``restore``)."""
        entry, keeper, outbox = saved
        try:
            record = self._write_until_decided(entry, keeper)
        except Exception as error:
            self._forget(outbox, entry, error)
            raise
        self._forget(outbox, entry, None)
        return record

    def _saved(self, ticket: Ticket, keeper: LeaseKeeper, result: Outcome) -> _Saved:
        facts = output_facts(ticket.capture)
        entry = _entry(ticket, keeper.lease, result, self._store, facts)
        return entry, keeper, self._put(entry)

    def _put(self, entry: OutboxEntry) -> Outbox | None:
        outbox = self.outbox() if entry.store else None
        if outbox is None:
            return None
        try:
            outbox.put(entry)
        except OSError as error:
            log.warning("process %r: outcome not saved in %r: %s", entry.process_id, outbox, error)
            return None
        return outbox

    @staticmethod
    def _forget(outbox: Outbox | None, entry: OutboxEntry, error: Exception | None) -> None:
        """Delete the entry once the store decided: it took the terminal, or refused it for
        good. A store failure or a bug leaves it for ``restore`` to deliver."""
        refused = isinstance(error, ProcledgerError) and not isinstance(error, StoreError)
        if outbox is not None and (error is None or refused):
            outbox.remove(entry)

    def _write_until_decided(self, entry: OutboxEntry, keeper: LeaseKeeper) -> ProcessRecord | None:
        """Record ``entry`` until the store accepts or refuses it; one line to ``notice`` when
        the wait begins and one when it ends."""
        lease: Lease | None = keeper.lease
        pause, waiting = RETRY_FIRST_S, False
        while lease is not None:
            try:
                try:
                    record = record_entry(self._registry, entry, lease)
                except LeaseLost:  # e.g. it lapsed during an outage: take it again, if ours
                    lease, after = self._lease_again(entry.process_id)
                    if lease is not None:
                        continue
                    return after
            except (StoreUnavailable, WriteConflict) as error:  # also while retaking the lease
                if not waiting:
                    waiting = True
                    self.say(_waiting_line(entry, error))
                time.sleep(pause)  # backing off from a failing store; no event tells us it is back
                pause = min(pause * 2, RETRY_MAX_S)
                continue
            if waiting:
                self.say(f"recorded process {entry.process_id!r} in the store")
            return record
        return None

    def _lease_again(self, pid: str) -> tuple[Lease | None, ProcessRecord | None]:
        """After ``LeaseLost`` on a terminal write: the record if someone recorded a terminal
        (a delivery of our own outbox entry, say); a fresh lease of ours if the old one only
        expired during a long outage and nobody took it; else neither."""
        registry = self._registry
        record = registry.get(pid)
        if record.is_terminal:
            return None, record
        current = registry.get_lease(pid)
        if current is not None and current.is_live(registry.now_ms()):
            log.warning("process %r: lease lost before its terminal was recorded", pid)
            return None, None
        try:
            claimed = registry.claim_lease(pid, self._owner, self._timings.ttl_ms)
        except InvalidTransition:  # it ended just now
            return None, registry.get(pid)
        return (claimed.lease, None) if isinstance(claimed, Acquired) else (None, None)


def _entry(
    ticket: Ticket, lease: Lease, result: Outcome, store: str | None, output: OutputFacts
) -> OutboxEntry:
    """The outbox entry of ``result`` (``store`` empty where there is no outbox)."""
    return OutboxEntry.of(
        result.with_output(*output),
        store=store or "",
        host_id=this_host_id() or "",
        process_id=ticket.process_id,
        registration_hash=ticket.registration_hash,
        event_id=ticket.ids.completed,
        owner=lease.owner.model_dump(mode="json"),
        written_at_ms=int(time.time() * 1000),
    )


def _waiting_line(entry: OutboxEntry, error: Exception) -> str:
    ended = f"exit code {entry.exit_code}" if entry.exit_code is not None else entry.state
    return (
        f"process {entry.process_id!r} ended ({ended}); the store is unavailable, "
        f"retrying until it accepts the outcome (saved locally meanwhile): {error}"
    )
