"""The ``RecoveryWorker``: the driver of docs/design.md §3.6 that walks the non-terminal
processes, reads the facts ``plan`` decides on, and hands each decision to the piece that
carries it out (``Attempts`` runs, ``Abandoner`` abandons).

It reads the ledger only through ``ProcessRegistry`` (docs/design.md §1.2): the walk, the
leases held and each process's record with its lease are registry reads, never rows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, final

from procledger.adapters.outbox import Outbox, default_outbox
from procledger.application.leases import FreeProcess
from procledger.application.outbox import deliver_outbox, store_key
from procledger.domain.leases import Lease, LeaseOwner, LeaseTimings
from procledger.domain.records import ProcessRecord
from procledger.domain.vocabulary import RecoveryDisposition, TerminalReason
from procledger.recovery.abandon import Abandoner
from procledger.recovery.attempt import Attempts
from procledger.recovery.cancels import Cancels
from procledger.recovery.claims import Claimant, is_owned_by
from procledger.recovery.plan import SKIP, Action, Plan, plan
from procledger.recovery.results import Engine, Runner, SweepReport, Tally
from procledger.recovery.runner import DefaultRunner, default_stop_policy
from procledger.supervisor.execution import StopPolicy

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = ["RecoveryWorker"]

log = logging.getLogger("procledger.recovery")

_Facts = tuple[ProcessRecord, Lease | None, bool]
"""A process's fresh record, its stored lease, and whether the lease's holder is provably dead."""


@final
class RecoveryWorker:
    """Recovers processes by their declared disposition; see ``procledger.recovery``.

    ``owner`` is the worker's identity: attempts claim as ``<owner_id>:recovery:<uuid>`` with
    its liveness, and ``drain`` recognises both. ``runner`` defaults to ``DefaultRunner`` with
    ``engines``; ``stop`` is the default runner's stop policy (``default_stop_policy``).
    """

    def __init__(
        self,
        registry: ProcessRegistry,
        owner: LeaseOwner,
        runner: Runner | None = None,
        *,
        timings: LeaseTimings = LeaseTimings(),  # noqa: B008 -- an immutable value
        engines: Mapping[str, Engine] | None = None,
        stop: StopPolicy | None = None,
        outbox: Outbox | None = None,
        output_dir: Path | None = None,
    ) -> None:
        """A worker that does nothing until ``sweep``, ``drain`` or ``serve`` is called.

        Args:
            owner: the worker's identity; give each worker its own, so that liveness can tell
                a dead worker's attempts from a live one's.
            runner: executes a claimed process; ``DefaultRunner`` (commands, ``engines``)
                when omitted.
            timings: the ttl and renewal period of every attempt's lease. An attempt gives
                up with a whole period of lease left and its tree gets half of one to stop,
                so two holders never run the same process at once.
            stop: the default runner's stop policy (``default_stop_policy(timings)``).
            outbox: the local outbox delivered before each pass (docs/design.md §6.3); the
                user's when omitted, none for an in-memory store.
            output_dir: where the default runner keeps the output of the commands it re-runs
                (docs/design.md §14); ``<state dir>/output`` when omitted.
        """
        self.registry = registry
        self.owner = owner
        self.timings = timings
        self._claimant = Claimant(registry, owner, timings)
        self._cancels = Cancels()
        runner = runner or DefaultRunner(
            registry, engines or {}, stop or default_stop_policy(timings), output_dir=output_dir
        )
        self._attempts = Attempts(self._claimant, self._cancels, runner)
        self._abandoner = Abandoner(self._claimant, output_dir)
        self._outbox = outbox

    @property
    def runner(self) -> Runner:
        """What executes a claimed process; replacing it takes effect from the next attempt."""
        return self._attempts.runner

    @runner.setter
    def runner(self, runner: Runner) -> None:
        self._attempts.runner = runner

    # -- public ---------------------------------------------------------------------------------

    def sweep(self) -> SweepReport:
        """One pass over the non-terminal processes, doing for each what its disposition
        allows (the table in ``procledger.recovery``) and nothing more.

        Workers sweeping at once share the work: each takes the next process whose lease is
        free, passing over those another worker is taking or holds (``claim_next_free``), so
        no process is visited by two of them and each is run or abandoned once. Then it
        visits the processes whose live lease a provably dead holder keeps.

        Returns:
            Every visited process id by what happened to it; ``stop`` ends the pass early.

        Raises:
            StoreError: the store failed; what was recorded so far stands, and an attempt
                whose lease was left held is taken over once that lease lapses.
        """
        tally = Tally()
        self.deliver_outbox()
        self._sweep_free(tally)
        self._sweep_dead_holders(tally)
        return tally.report()

    def drain(self) -> SweepReport:
        """Abandon every started owner_bound process this owner (or one of its recovery
        attempts) first started, as ``owner_drain`` with this owner as evidence.

        For an owner that is going away for good: its owner_bound work may never run
        elsewhere, so it is closed rather than left for a sweep that would only skip it.
        Nothing else is touched, and a process whose lease a live holder keeps is skipped.

        Returns:
            Every visited process id by what happened to it.

        Raises:
            StoreError: the store failed; what was recorded so far stands.
        """
        tally = Tally()
        self.deliver_outbox()
        for process_id in self._walk():
            self._drain_one(process_id, tally)
        return tally.report()

    def serve(
        self,
        *,
        interval_s: float = 1.0,
        max_sweeps: int | None = None,
        on_report: Callable[[SweepReport], None] | None = None,
    ) -> int:
        """Sweep, wait ``interval_s`` (cut short by ``stop``), and repeat, so work left by a
        dead holder is picked up within about ``interval_s`` of its lease lapsing.

        Args:
            max_sweeps: stop after this many passes (``None``: until ``stop``).
            on_report: called with each pass's report, on this thread.

        Returns:
            The number of passes made.

        Raises:
            StoreError: a pass failed; the loop ends with it (a caller retries by calling
                ``serve`` again).
        """
        passes = 0
        while not self._cancels.stopping:
            report = self.sweep()
            passes += 1
            if on_report is not None:
                on_report(report)
            if max_sweeps is not None and passes >= max_sweeps:
                break
            self._cancels.wait(interval_s)
        return passes

    def stop(self) -> None:
        """Stop for good, from any thread (not from a signal handler, which could deadlock on
        the worker's lock): running attempts are cancelled (their trees stopped), rerunnable
        work is handed back at once, and ``sweep``/``serve`` return after them."""
        self._cancels.stop()

    def deliver_outbox(self) -> list[ProcessRecord]:
        """Record the outcomes this host's supervisors knew but could not write (their outbox
        entries, docs/design.md §6.3) -- done first by every ``sweep`` and ``drain``, so no
        process whose true outcome is on this disk is judged lost or abandoned.

        Returns:
            The records written.

        Raises:
            StoreError: the store failed; what was delivered so far stands.
        """
        if store_key(self.registry.location) is None:
            return []
        if self._outbox is None:
            try:
                self._outbox = default_outbox()
            except OSError as error:
                log.warning("no outbox to deliver: %s", error)
                return []
        return deliver_outbox(self.registry, self._outbox, ttl_ms=self.timings.ttl_ms)

    @property
    def stopping(self) -> bool:
        """Whether ``stop`` was called: a caller's loop around ``sweep`` should end."""
        return self._cancels.stopping

    # -- walking --------------------------------------------------------------------------------

    def _walk(self) -> Iterator[str]:
        """The non-terminal processes' ids in code point order, until ``stop``."""
        for process_id in self.registry.non_terminal_ids():
            if self._cancels.stopping:
                return
            yield process_id

    def _sweep_free(self, tally: Tally) -> None:
        """Every process whose lease is free, once, taking each as ``plan`` says."""
        after = ""
        while not self._cancels.stopping:
            since, decided = time.monotonic(), list[Plan]()
            found = self.registry.claim_next_free(
                after,
                self._claimant.incarnation(),
                self.timings.ttl_ms,
                partial(self._decide, decided=decided),
            )
            if found is None:
                return
            after = found.process_id
            self._settle(found, decided[-1] if decided else SKIP, since, tally)

    def _decide(self, record: ProcessRecord, lapsed: Lease | None, *, decided: list[Plan]) -> bool:
        """``plan`` for a process with a free lease (kept in ``decided``): whether to claim."""
        dead = lapsed is not None and self.registry.probe.provably_dead(lapsed.owner, self.owner)
        decision = plan(record, lapsed, now_ms=self.registry.now_ms(), holder_dead=dead)
        decided.append(decision)
        return decision.claims

    def _settle(self, found: FreeProcess, decision: Plan, since: float, tally: Tally) -> None:
        record, lease = found.record, found.acquired
        if record is None or (decision.claims and lease is None):
            tally.skipped.append(found.process_id)  # damaged, or claimed by another meanwhile
        elif lease is not None:
            keeper = self._claimant.keeper(lease, since)
            if decision.action is Action.run:
                self._attempts.run_claimed(keeper, record, tally)  # read under the claim's lock
            else:
                assert decision.reason is not None
                self._abandoner.abandon_with(
                    record, lease, decision.reason, decision.evidence, tally
                )
        elif decision.action is Action.abandon:
            self._abandoner.abandon(record, found.lapsed, decision, tally)
        else:
            tally.skipped.append(found.process_id)

    def _sweep_dead_holders(self, tally: Tally) -> None:
        """Visit the processes whose live lease is kept by a holder provably dead on this host
        (a crashed supervisor, before its lease expires); live holders are not visited."""
        for holder in self.registry.held_leases(self.registry.now_ms()):
            if self._cancels.stopping:
                return
            if self.registry.probe.provably_dead(holder.owner, self.owner):
                self._recover(holder.process_id, tally)

    def _facts(self, process_id: str) -> _Facts | None:
        """The fresh record, its stored lease (as ``get_lease`` returns it) and whether the
        holder is provably dead; ``None`` if the process was pruned since the walk began.

        One read of the record with its lease (``record_and_lease``): several workers walk
        the same ids, and most of their visits end here."""
        found = self.registry.record_and_lease(process_id)
        if found is None:
            return None
        record, lease = found
        if lease is None or record.disposition is RecoveryDisposition.externally_owned:
            return record, None, False
        return record, lease, self.registry.probe.provably_dead(lease.owner, self.owner)

    def _recover(self, process_id: str, tally: Tally) -> None:
        facts = self._facts(process_id)
        if facts is None:
            tally.skipped.append(process_id)
            return
        record, lease, dead = facts
        decision = plan(record, lease, now_ms=self.registry.now_ms(), holder_dead=dead)
        if decision.action is Action.abandon:
            self._abandoner.abandon(record, lease, decision, tally)
        elif decision.action is Action.run:
            self._attempts.attempt(record, lease if decision.reclaim else None, tally)
        else:
            tally.skipped.append(process_id)

    # -- draining -------------------------------------------------------------------------------

    def _drain_one(self, process_id: str, tally: Tally) -> None:
        facts = self._facts(process_id)
        if facts is None or not self._drainable(facts[0]):
            tally.skipped.append(process_id)
            return
        record, lease, dead = facts
        if lease is not None and lease.is_live(self.registry.now_ms()) and not dead:
            tally.skipped.append(process_id)  # a live holder is still executing it
            return
        keeper = self._claimant.claim(process_id, lease if dead else None)
        if keeper is None:
            tally.skipped.append(process_id)
            return
        self._abandoner.abandon_with(
            record, keeper.lease, TerminalReason.owner_drain, self.owner, tally
        )

    def _drainable(self, record: ProcessRecord) -> bool:
        return (
            not record.state.is_terminal
            and record.disposition is RecoveryDisposition.owner_bound
            and record.first_started is not None
            and is_owned_by(record.first_started.owner.owner_id, self.owner.owner_id)
        )
