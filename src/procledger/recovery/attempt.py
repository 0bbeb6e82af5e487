"""One attempt: run a claimed process once and write what came of it (docs/design.md §3.6).

The attempt holds the lease it claimed as a fresh incarnation; a ``RenewalThread`` renews it
while the runner runs and cancels the run when it can no longer (``recovery.renewal``). A lost
attempt writes nothing; a write it makes anyway (a result that raced the renewal) is refused by
the fence: ``LeaseLost``, and the process is listed under ``lost``. Before writing a result the
attempt also checks that its local deadline has not passed: the store accepts a terminal
identical to the recorded one without any lease (an idempotent replay), so a paused worker whose
result happens to equal its successor's must notice on its own that the work is no longer its
to report.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from procledger.application.lease_keeper import LeaseKeeper
from procledger.domain.errors import InvalidTransition, LeaseLost, ProcessLifecycleValidationError
from procledger.domain.leases import Lease
from procledger.domain.records import ProcessRecord
from procledger.domain.vocabulary import ProcessState, RecoveryDisposition, TerminalReason
from procledger.recovery.cancels import Cancels
from procledger.recovery.claims import Claimant
from procledger.recovery.plan import still_runnable
from procledger.recovery.renewal import RenewalThread
from procledger.recovery.results import (
    Runner,
    RunOutput,
    RunResult,
    Tally,
    diagnostic_of,
    failure_output,
    failure_reason,
)

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = ["Attempts"]


class Attempts:
    """Runs the processes a worker decided to run, with ``runner``, and writes each outcome;
    ``cancels`` is how the worker's ``stop`` reaches a running attempt."""

    def __init__(self, claimant: Claimant, cancels: Cancels, runner: Runner) -> None:
        self.claimant = claimant
        self.cancels = cancels
        self.runner = runner

    @property
    def registry(self) -> ProcessRegistry:
        return self.claimant.registry

    def attempt(self, record: ProcessRecord, observed: Lease | None, tally: Tally) -> None:
        """Claim (or reclaim from ``observed``, a provably dead holder) and run."""
        keeper = self.claimant.claim(record.id, observed)
        if keeper is None:
            tally.skipped.append(record.id)
            return
        self.run_claimed(keeper, None, tally)

    def run_claimed(self, keeper: LeaseKeeper, fresh: ProcessRecord | None, tally: Tally) -> None:
        """Run the process whose lease ``keeper`` holds; ``fresh`` is its record if it was
        read in the claim's own transaction (else it is read again here)."""
        process_id = keeper.lease.process_id
        try:
            prepared = self._prepare(keeper, fresh)
        except LeaseLost:
            tally.lost.append(process_id)
            return
        if prepared is None:
            self.registry.release_lease(keeper.lease)
            tally.skipped.append(process_id)
            return
        self._execute(prepared, keeper, tally)

    def _prepare(self, keeper: LeaseKeeper, fresh: ProcessRecord | None) -> ProcessRecord | None:
        """With the lease held: re-read (unless ``fresh`` was read in the claim's own
        transaction), then (owner_bound) renew and record first_started -- before anything
        executes -- and record ``started`` while still ``starting``. ``None`` when the process
        is no longer ours to run."""
        process_id = keeper.lease.process_id
        record = fresh or self.registry.get(process_id)
        if not still_runnable(record):
            return None
        if record.disposition is RecoveryDisposition.owner_bound:
            lease = keeper.renew_or_raise(time.monotonic())
            record = self.registry.record_first_started(
                process_id, lease.owner, self.registry.now_ms()
            )
            if record.first_started is None or record.first_started.owner != lease.owner:
                return None  # someone else's first start won: never run it twice
        if record.state is not ProcessState.starting:
            return record
        try:
            return self.registry.record_started(process_id, self.registry.now_ms())
        except InvalidTransition:
            record = self.registry.get(process_id)  # started or finished meanwhile
            return record if record.state is ProcessState.running else None

    def _execute(self, record: ProcessRecord, keeper: LeaseKeeper, tally: Tally) -> None:
        result: RunResult | None = None
        error: Exception | None = None
        with self.cancels.scope() as cancel, RenewalThread(keeper, cancel) as renewal:
            try:
                result = _checked(self.runner(record, keeper.lease, cancel))
            except Exception as exc:
                error = exc
        if renewal.lost or keeper.is_lapsed(time.monotonic()):
            tally.lost.append(record.id)  # fenced off: the new holder owns it; write nothing
        elif error is not None and cancel.is_set():
            self._stand_down(record, keeper.lease, tally, failure_output(error))
        else:
            self._record_outcome(keeper.lease, result, error, tally)

    def _record_outcome(
        self, lease: Lease, result: RunResult | None, error: Exception | None, tally: Tally
    ) -> None:
        process_id = lease.process_id
        try:
            if result is not None:
                try:
                    self._complete_exited(lease, result)
                    tally.ran.append(process_id)
                    return
                except ProcessLifecycleValidationError as invalid:
                    error = invalid  # e.g. a value the record cannot hold
            assert error is not None
            output, tails = (
                (result.output, result.tails) if result is not None else failure_output(error)
            )
            self.registry.record_completed(
                process_id,
                ProcessState.failed,
                failure_reason(error),
                diagnostic=diagnostic_of(error),
                lease=lease,
                output=output,
                tails=tails or None,
            )
            tally.failed.append(process_id)
        except LeaseLost:
            tally.lost.append(process_id)
        except InvalidTransition:  # finished by someone with an authority meanwhile
            self.registry.release_lease(lease)
            tally.lost.append(process_id)

    def _complete_exited(self, lease: Lease, result: RunResult) -> None:
        self.registry.record_completed(
            lease.process_id,
            ProcessState.exited,
            TerminalReason.exited,
            exit_code=result.exit_code,
            value=result.value,
            lease=lease,
            output=result.output,
            tails=result.tails or None,
        )

    def _stand_down(
        self, record: ProcessRecord, lease: Lease, tally: Tally, facts: RunOutput
    ) -> None:
        """The worker was stopped mid-run and its runner gave up: hand rerunnable work back at
        once (nothing ends, so no output facts: the next attempt's output replaces what this
        one kept); record owner_bound work as stopped, with its output, since nobody may run
        it again."""
        try:
            if record.disposition is RecoveryDisposition.owner_bound:
                self.registry.record_completed(
                    record.id,
                    ProcessState.terminated,
                    TerminalReason.runner_shutdown,
                    lease=lease,
                    output=facts[0],
                    tails=facts[1] or None,
                )
            else:
                self.registry.release_lease(lease)
        except (LeaseLost, InvalidTransition):
            pass  # fenced off or finished meanwhile: nothing of ours to record
        tally.lost.append(record.id)


def _checked(result: object) -> RunResult:
    if not isinstance(result, RunResult):
        raise TypeError(f"a runner must return a RunResult, not {type(result).__name__}")
    return result
