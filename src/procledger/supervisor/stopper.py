"""Stopping supervised runs (docs/design.md §6.2): this supervisor's ``stop``, a stop requested
elsewhere (found by the ticker's poll), a lost lease, and the shutdown of every tree.

A stop is *recorded* first (``stop_requested``, with an id derived from the registration), then
noted on the run and carried out by signalling the tree; the run's completion path writes the
terminal, which then says why the process ended. A run that has ended is never signalled: its
pid may be reused.
"""

from __future__ import annotations

import functools
import logging
import signal
import threading
from typing import TYPE_CHECKING

from procledger.domain.errors import InvalidTransition
from procledger.domain.records import ProcessRecord
from procledger.domain.vocabulary import TerminalReason
from procledger.supervisor.completion import terminal_record
from procledger.supervisor.decide import mode_policy, request_policy
from procledger.supervisor.execution import StopPolicy
from procledger.supervisor.modes import StopMode
from procledger.supervisor.owners import HelperThreads
from procledger.supervisor.runs import Run
from procledger.supervisor.starter import KILL_NOW

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = ["Stopper"]

log = logging.getLogger("procledger.supervisor")

_SIGTERM = signal.SIGTERM


class Stopper:
    """Records and carries out stops of runs with this supervisor's stop ``policy``."""

    def __init__(
        self, registry: ProcessRegistry, policy: StopPolicy, helpers: HelperThreads
    ) -> None:
        self._registry, self._policy, self._helpers = registry, policy, helpers

    def stop(self, run: Run, mode: StopMode, grace_s: float | None) -> ProcessRecord:
        """``Supervisor.stop`` of one run: the record once it ended (``interrupt``: once the
        grace passed, perhaps still running -- it never escalates)."""
        grace = run.child.policy.grace_s if grace_s is None else grace_s
        policy, escalate = mode_policy(mode, grace)
        if not self.request(run, mode.reason):
            return terminal_record(self._registry, run, None)
        exited = run.child.stop(policy, escalate=escalate)
        if exited and run.done.wait(grace if mode is StopMode.interrupt else None):
            return terminal_record(self._registry, run, None)
        return self._registry.get(run.process_id)

    def request(self, run: Run, reason: TerminalReason, *, durable: bool = False) -> bool:
        """Note a stop request (recording it unless ``durable`` already); False if the process
        has already ended, in which case nothing is recorded and nothing may be signalled."""
        if not run.claim(reason):
            return False
        if not durable:
            try:
                self._registry.request_stop(run.process_id, reason, event_id=run.ids.stop[reason])
            except InvalidTransition:  # its terminal was recorded meanwhile
                return False
        return run.note_requested(reason)

    def request_soon(self, run: Run, reason: TerminalReason) -> None:
        """Record and carry out a stop in the background (a signal handler must not block)."""
        self._helpers.start(functools.partial(self._carry_out, run, reason, durable=False))

    def take_found(self, run: Run, seq: int) -> None:
        """Carry out, in the background, each stop request on record not yet acted on here
        (``seq``: the record's change number the poll saw)."""
        try:
            requested = self._registry.get(run.process_id).stop_requested
        except Exception as error:
            log.info("process %r: reading its stop requests failed: %s", run.process_id, error)
            return
        run.seen_change_seq = seq
        for reason in requested:
            if run.claim_found(reason):
                self._helpers.start(functools.partial(self._carry_out, run, reason, durable=True))

    def lease_lost(self, run: Run) -> None:
        """Another holder owns the process now: kill the tree, and leave its terminal to them."""
        if not run.mark_lease_lost():
            return
        log.warning("process %r: lease lost; killing its tree", run.process_id)
        self._helpers.start(functools.partial(run.child.stop, KILL_NOW))

    def stop_all(self, runs: list[Run], grace_s: float) -> None:
        """Shutdown: SIGTERM to every tree at once, SIGKILL after ``grace_s``; returns once
        each was signalled to the end of its escalation."""
        policy = StopPolicy((_SIGTERM,), grace_s)
        stoppers = [
            threading.Thread(target=run.child.stop, args=(policy,), daemon=True) for run in runs
        ]
        for thread in stoppers:
            thread.start()
        for thread in stoppers:
            thread.join()

    def _carry_out(self, run: Run, reason: TerminalReason, *, durable: bool) -> None:
        if self.request(run, reason, durable=durable):
            run.child.stop(request_policy(reason, run.child.policy), escalate=True)
