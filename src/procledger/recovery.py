"""Recovery by declared disposition: the sweep, the owner drain, self-fencing runs (DESIGN §3.6).

A ``RecoveryWorker`` walks the non-terminal processes in id order and does for each what its
declared disposition allows -- nothing more::

    externally_owned   never claimed, never run; a pending abandon request -> abandoned
    rerunnable         claim (or reclaim from a provably dead holder) and run again
    owner_bound        never started: claim, record first_started, run once;
                       started: never run again -- a provably dead holder -> abandoned/owner_dead,
                       an abandon request and a lapsed lease -> abandoned/abandon_requested,
                       anything else is left alone (elapsed time alone never abandons)

``plan`` makes that decision as a pure function of the record, the stored lease, the time and
whether the holder is provably dead. ``RecoveryWorker`` is the driver that reads those facts,
claims, runs and writes; every attempt claims as a fresh incarnation of the worker's owner, so
a later pass never re-enters a running attempt's lease.

**Self-fencing.** While a runner runs, a renewal thread renews the attempt's lease every
``renew_ms``. When a renewal is refused (``LeaseLost``), or renewals keep failing until less
than ``renew_ms`` of the lease is left by this process's monotonic clock (a paused worker wakes
up past that point), the attempt's ``cancel`` is set -- the default runner then stops the
process tree, with a grace of half a renewal period -- and the attempt writes nothing. A write
it makes anyway (a result that raced the renewal) is refused by the fence: ``LeaseLost``, and
the process is listed under ``lost``. Before writing a result the attempt also checks that its
local deadline has not passed: the store accepts a terminal identical to the recorded one
without any lease (an idempotent replay), so a paused worker whose result happens to equal its
successor's must notice on its own that the work is no longer its to report.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final, final

from pydantic import Field, JsonValue

from procledger.domain._model import Frozen
from procledger.domain.errors import (
    AuthorityRejected,
    ExecutionError,
    InvalidTransition,
    LeaseLost,
    ProcessLifecycleValidationError,
)
from procledger.domain.leases import (
    Acquired,
    CompletionAuthority,
    Lease,
    LeaseOwner,
    LeaseTimings,
)
from procledger.domain.records import MAX_DIAGNOSTIC_BYTES, ProcessRecord
from procledger.domain.vocabulary import (
    ProcessState,
    RecoveryDisposition,
    TerminalReason,
)
from procledger.projections.records import read_record
from procledger.registry import ProcessRegistry, lease_from_row
from procledger.supervisor.execution import StopPolicy, run_captured

__all__ = [
    "Action",
    "DefaultRunner",
    "Engine",
    "Plan",
    "RecoveryWorker",
    "RunResult",
    "Runner",
    "SweepReport",
    "plan",
    "recovery_owner_id",
]

EXTERNALLY_OWNED: Final = RecoveryDisposition.externally_owned
RECOVERY_MARK: Final = ":recovery:"
"""Separates a worker's owner id from the attempt id in an attempt's ``owner_id``."""


@final
class RunResult(Frozen):
    """What a runner returns: recorded as ``completed/exited`` with this code and value."""

    exit_code: int = 0
    value: JsonValue = None


@final
class SweepReport(Frozen):
    """Process ids by outcome of one pass, each in the order the pass reached it.

    - ``ran``: run to completion and recorded ``completed/exited``;
    - ``abandoned``: recorded ``abandoned`` by this pass;
    - ``skipped``: looked at and left untouched (including those another worker holds);
    - ``failed``: the runner raised, recorded ``completed/failed`` with the error as diagnostic;
    - ``lost``: attempts this worker did not finish: its lease was lost (nothing written; the
      new holder owns the process now), or the worker was stopped mid-run (``stop()``): a
      rerunnable process's lease is released for another worker, an owner_bound one is recorded
      ``completed/terminated/runner_shutdown`` because it may never run again.
    """

    ran: list[str] = Field(default_factory=list)
    abandoned: list[str] = Field(default_factory=list)
    skipped: list[str] = Field(default_factory=list)
    failed: list[str] = Field(default_factory=list)
    lost: list[str] = Field(default_factory=list)


Runner = Callable[[ProcessRecord, Lease, threading.Event], RunResult]
"""``runner(record, lease, cancel) -> RunResult``; it should return or raise soon after
``cancel`` is set (the default runner stops the process tree)."""

Engine = Runner
"""Runs ``engine`` inputs of one ``kind``: ``RecoveryWorker(..., engines={"kind": engine})``."""


def recovery_owner_id(owner_id: str) -> str:
    """A fresh attempt's owner id: ``<owner_id>:recovery:<uuid>``."""
    return f"{owner_id}{RECOVERY_MARK}{uuid.uuid4()}"


def is_owned_by(candidate_owner_id: str, owner_id: str) -> bool:
    """Whether ``candidate_owner_id`` is ``owner_id`` itself or one of its recovery attempts."""
    return candidate_owner_id == owner_id or candidate_owner_id.startswith(owner_id + RECOVERY_MARK)


# -- the decision ---------------------------------------------------------------------------------


class Action(StrEnum):
    skip = "skip"
    run = "run"
    abandon = "abandon"


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do with one process. ``reclaim``: claim against the observed (provably dead)
    holder; ``authority``: abandon without a lease (externally_owned, reconciled)."""

    action: Action
    reason: TerminalReason | None = None
    evidence: LeaseOwner | None = None
    reclaim: bool = False
    authority: bool = False


SKIP: Final = Plan(Action.skip)


def plan(record: ProcessRecord, lease: Lease | None, *, now_ms: int, holder_dead: bool) -> Plan:
    """The disposition table of §3.6 as a pure function.

    ``lease`` is the stored lease (``get_lease``: possibly expired, ``None`` when released or
    never claimed); ``holder_dead`` says whether its owner is provably dead for this worker.
    """
    if record.state.is_terminal:
        return SKIP
    if record.disposition is RecoveryDisposition.externally_owned:
        if record.abandon_request is None:
            return SKIP
        return Plan(Action.abandon, TerminalReason.abandon_requested, authority=True)
    dead = lease is not None and holder_dead
    live = lease is not None and lease.is_live(now_ms)
    if record.disposition is RecoveryDisposition.owner_bound and record.first_started is not None:
        if dead:
            assert lease is not None
            return Plan(Action.abandon, TerminalReason.owner_dead, lease.owner, reclaim=True)
        if record.abandon_request is not None and not live:
            evidence = record.first_started.owner
            return Plan(Action.abandon, TerminalReason.abandon_requested, evidence)
        return SKIP
    if record.input.type == "external" or (live and not dead):
        return SKIP  # external work is never executed here; a live holder keeps its work
    return Plan(Action.run, reclaim=dead)


def _still_runnable(record: ProcessRecord) -> bool:
    """Re-checked once the lease is ours: the record we planned from may be stale."""
    if record.state.is_terminal:
        return False
    return not (
        record.disposition is RecoveryDisposition.owner_bound and record.first_started is not None
    )


def diagnostic_of(error: BaseException) -> str:
    """``"<Type>: <message>"``, cut to the diagnostic limit on a character boundary."""
    text = f"{type(error).__name__}: {error}".rstrip(": ")
    return text.encode()[:MAX_DIAGNOSTIC_BYTES].decode("utf-8", "ignore")


# -- the default runner ---------------------------------------------------------------------------


class DefaultRunner:
    """Runs ``command`` inputs with ``run_captured`` (environment from ``load_env``, the
    registration's ``cwd``; output is discarded) and ``engine`` inputs with the engine
    registered for their kind. An unknown engine, a command killed by a signal nobody asked
    for, or ``external`` input raises, so the attempt is recorded ``completed/failed``."""

    def __init__(
        self, registry: ProcessRegistry, engines: Mapping[str, Engine], stop: StopPolicy
    ) -> None:
        self.registry = registry
        self.engines = dict(engines)
        self.stop = stop

    def __call__(self, record: ProcessRecord, lease: Lease, cancel: threading.Event) -> RunResult:
        spec = record.input
        if spec.type == "command":
            return self._command(record, cancel)
        if spec.type == "engine":
            engine = self.engines.get(spec.kind or "")
            if engine is None:
                known = ", ".join(sorted(self.engines)) or "none"
                raise LookupError(
                    f"process {record.id!r}: no engine registered for kind {spec.kind!r} "
                    f"(this worker knows: {known})"
                )
            return engine(record, lease, cancel)
        raise ValueError(f"process {record.id!r}: {spec.type} work is never executed here")

    def _command(self, record: ProcessRecord, cancel: threading.Event) -> RunResult:
        argv = list(record.input.argv or ())
        env = self.registry.load_env(record.env_ref) if record.env_ref else None
        output = run_captured(argv, cwd=record.input.cwd, env=env, stop=self.stop, cancel=cancel)
        if output.returncode < 0:
            name = signal.Signals(-output.returncode).name
            raise ExecutionError(f"process {record.id!r}: {argv[0]!r} was killed by {name}")
        return RunResult(exit_code=output.returncode)


def default_stop_policy(timings: LeaseTimings) -> StopPolicy:
    """SIGTERM, then SIGKILL after half a renewal period: a fenced-off tree stops well before
    the lease it ran under could be taken over."""
    return StopPolicy((signal.SIGTERM,), grace_s=timings.renew_ms / 2000)


# -- lease renewal while a runner runs ------------------------------------------------------------


class _Renewal:
    """Renews one attempt's lease every ``renew_ms`` on its own thread until ``finish``.

    Gives up -- sets ``cancel`` and ``lost`` -- when a renewal is refused, or when less than one
    renewal period of the lease is left by the local monotonic clock (the deadline is counted
    from *before* the claim or renewal that set it, so it is never later than the store's)."""

    def __init__(
        self,
        registry: ProcessRegistry,
        lease: Lease,
        timings: LeaseTimings,
        cancel: threading.Event,
        since: float,
    ) -> None:
        self.registry = registry
        self.lease = lease
        self.lost = False
        self._ttl_ms = timings.ttl_ms
        self._period_s = timings.renew_ms / 1000
        self._deadline = since + timings.ttl_ms / 1000
        self._cancel = cancel
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"procledger-renew:{lease.process_id}", daemon=True
        )

    def __enter__(self) -> _Renewal:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        self._thread.join()

    @property
    def lapsed(self) -> bool:
        """Whether the lease may have expired by now (by the local clock): checked before the
        result is written, because the store accepts an identical terminal without a lease."""
        return time.monotonic() >= self._deadline

    def _run(self) -> None:
        while not self._done.wait(self._period_s):
            if not self._renew_once():
                self.lost = True
                self._cancel.set()
                return

    def _renew_once(self) -> bool:
        before = time.monotonic()
        if self._deadline - before < self._period_s:
            return False  # paused, or the store kept failing: too late to renew safely
        try:
            self.lease = self.registry.renew_lease(self.lease, self._ttl_ms)
        except LeaseLost:
            return False
        except Exception:  # a transient store failure: retried next period until the deadline
            return True
        self._deadline = before + self._ttl_ms / 1000
        return True


# -- the worker ----------------------------------------------------------------------------------


@dataclass
class _Tally:
    ran: list[str] = field(default_factory=list)
    abandoned: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)

    def report(self) -> SweepReport:
        return SweepReport(
            ran=self.ran,
            abandoned=self.abandoned,
            skipped=self.skipped,
            failed=self.failed,
            lost=self.lost,
        )


@dataclass(frozen=True, slots=True)
class _Claim:
    lease: Lease
    since: float
    """``time.monotonic()`` just before the claim: the local start of the lease's ttl."""


@final
class RecoveryWorker:
    """Recovers processes by their declared disposition; see the module docstring.

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
    ) -> None:
        self.registry = registry
        self.owner = owner
        self.timings = timings
        self.runner: Runner = runner or DefaultRunner(
            registry, engines or {}, stop or default_stop_policy(timings)
        )
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._cancels: set[threading.Event] = set()

    # -- public ---------------------------------------------------------------------------------

    def sweep(self) -> SweepReport:
        """One pass over the non-terminal processes, in id order; returns when it is done."""
        tally = _Tally()
        for process_id in self._walk():
            self._recover(process_id, tally)
        return tally.report()

    def drain(self) -> SweepReport:
        """Abandon (``owner_drain``, evidence: this owner) every started owner_bound process
        first started by this owner or one of its recovery attempts -- and nothing else. One
        whose lease a live holder keeps is skipped."""
        tally = _Tally()
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
        """Sweep, wait ``interval_s`` (cut short by ``stop``), repeat; until ``stop`` is called
        or ``max_sweeps`` passes are done. Returns the number of passes."""
        passes = 0
        while not self._stopping.is_set():
            report = self.sweep()
            passes += 1
            if on_report is not None:
                on_report(report)
            if max_sweeps is not None and passes >= max_sweeps:
                break
            self._stopping.wait(interval_s)
        return passes

    def stop(self) -> None:
        """Stop for good, from any thread (not from a signal handler): running attempts are
        cancelled (their trees stopped), and ``sweep``/``serve`` return after them."""
        self._stopping.set()
        with self._lock:
            for cancel in self._cancels:
                cancel.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    # -- walking --------------------------------------------------------------------------------

    def _walk(self) -> Iterator[str]:
        for process_id in self._non_terminal_ids():
            if self._stopping.is_set():
                return
            yield process_id

    def _non_terminal_ids(self) -> list[str]:
        """Ids of the non-terminal processes, from the records read model, in code point order
        (a PostgreSQL collation may order them otherwise)."""
        store = self.registry.store
        with store.read() as tx:
            rows = tx.execute(
                f"SELECT process_id FROM {store.table('records')} WHERE terminal=0"
            ).all()
        return sorted(str(row["process_id"]) for row in rows)

    def _facts(self, process_id: str) -> tuple[ProcessRecord, Lease | None, bool] | None:
        """The fresh record, its stored lease (as ``get_lease`` returns it) and whether the
        holder is provably dead; ``None`` if the process was pruned since the walk began.

        One read transaction of the read model and the lease table, rather than ``get`` and
        ``get_lease``: several workers walk the same ids, and most of their visits end here."""
        store = self.registry.store
        with store.read() as tx:
            record = read_record(tx, store, process_id)
            if record is None or record.state.is_terminal:
                return None if record is None else (record, None, False)
            row = tx.execute(
                f"SELECT owner, lease_token, fencing_token, claimed_at_ms, expires_at_ms, "
                f"released FROM {store.table('leases')} WHERE process_id=?",
                (process_id,),
            ).one()
        if row is None or row["released"] or record.disposition is EXTERNALLY_OWNED:
            return record, None, False
        lease = lease_from_row(process_id, row)
        return record, lease, self.registry.probe.provably_dead(lease.owner, self.owner)

    def _recover(self, process_id: str, tally: _Tally) -> None:
        facts = self._facts(process_id)
        if facts is None:
            tally.skipped.append(process_id)
            return
        record, lease, dead = facts
        decision = plan(record, lease, now_ms=self.registry.now_ms(), holder_dead=dead)
        if decision.action is Action.abandon:
            self._abandon(record, lease, decision, tally)
        elif decision.action is Action.run:
            self._attempt(record, lease if decision.reclaim else None, tally)
        else:
            tally.skipped.append(process_id)

    # -- leases ---------------------------------------------------------------------------------

    def _incarnation(self) -> LeaseOwner:
        """A fresh attempt owner: never re-enters another attempt's lease."""
        return LeaseOwner(
            owner_id=recovery_owner_id(self.owner.owner_id),
            incarnation_id=uuid.uuid4().hex,
            liveness=self.owner.liveness,
        )

    def _claim(self, process_id: str, observed: Lease | None) -> _Claim | None:
        """Claim as a fresh incarnation, or reclaim from ``observed`` (a provably dead holder)."""
        claimant, ttl, since = self._incarnation(), self.timings.ttl_ms, time.monotonic()
        if observed is None:
            outcome = self.registry.claim_lease(process_id, claimant, ttl)
        else:
            outcome = self.registry.reclaim_lease(process_id, claimant, observed, ttl)
        return _Claim(outcome.lease, since) if isinstance(outcome, Acquired) else None

    @contextmanager
    def _cancel_scope(self) -> Iterator[threading.Event]:
        cancel = threading.Event()
        with self._lock:
            self._cancels.add(cancel)
            if self._stopping.is_set():
                cancel.set()
        try:
            yield cancel
        finally:
            with self._lock:
                self._cancels.discard(cancel)

    # -- abandoning -------------------------------------------------------------------------------

    def _abandon(
        self, record: ProcessRecord, lease: Lease | None, decision: Plan, tally: _Tally
    ) -> None:
        process_id, reason = record.id, decision.reason
        assert reason is not None
        if decision.authority:
            try:
                self.registry.record_abandoned(
                    process_id, reason, authority=CompletionAuthority.reconciled_abandon()
                )
            except (InvalidTransition, AuthorityRejected):
                tally.skipped.append(process_id)  # finished meanwhile
                return
            tally.abandoned.append(process_id)
            return
        claim = self._claim(process_id, lease if decision.reclaim else None)
        if claim is None:
            tally.skipped.append(process_id)
            return
        self._abandon_with(claim.lease, reason, decision.evidence, tally)

    def _abandon_with(
        self, lease: Lease, reason: TerminalReason, evidence: LeaseOwner | None, tally: _Tally
    ) -> None:
        process_id = lease.process_id
        try:
            self.registry.record_abandoned(process_id, reason, owner=evidence, lease=lease)
        except LeaseLost:
            tally.lost.append(process_id)
        except InvalidTransition:  # finished between our look and our claim
            self.registry.release_lease(lease)
            tally.skipped.append(process_id)
        else:
            tally.abandoned.append(process_id)

    def _drain_one(self, process_id: str, tally: _Tally) -> None:
        facts = self._facts(process_id)
        if facts is None or not self._drainable(facts[0]):
            tally.skipped.append(process_id)
            return
        _, lease, dead = facts
        if lease is not None and lease.is_live(self.registry.now_ms()) and not dead:
            tally.skipped.append(process_id)  # a live holder is still executing it
            return
        claim = self._claim(process_id, lease if dead else None)
        if claim is None:
            tally.skipped.append(process_id)
            return
        self._abandon_with(claim.lease, TerminalReason.owner_drain, self.owner, tally)

    def _drainable(self, record: ProcessRecord) -> bool:
        return (
            not record.state.is_terminal
            and record.disposition is RecoveryDisposition.owner_bound
            and record.first_started is not None
            and is_owned_by(record.first_started.owner.owner_id, self.owner.owner_id)
        )

    # -- running ----------------------------------------------------------------------------------

    def _attempt(self, record: ProcessRecord, observed: Lease | None, tally: _Tally) -> None:
        process_id = record.id
        claim = self._claim(process_id, observed)
        if claim is None:
            tally.skipped.append(process_id)
            return
        try:
            prepared = self._prepare(claim)
        except LeaseLost:
            tally.lost.append(process_id)
            return
        if prepared is None:
            self.registry.release_lease(claim.lease)
            tally.skipped.append(process_id)
            return
        record, claim = prepared
        self._execute(record, claim, tally)

    def _prepare(self, claim: _Claim) -> tuple[ProcessRecord, _Claim] | None:
        """With the lease held: re-read, then (owner_bound) renew and record first_started --
        before anything executes -- and record ``started`` while still ``starting``. ``None``
        when the process is no longer ours to run."""
        process_id = claim.lease.process_id
        record = self.registry.get(process_id)
        if not _still_runnable(record):
            return None
        if record.disposition is RecoveryDisposition.owner_bound:
            since = time.monotonic()
            lease = self.registry.renew_lease(claim.lease, self.timings.ttl_ms)
            claim = _Claim(lease, since)
            record = self.registry.record_first_started(
                process_id, lease.owner, self.registry.now_ms()
            )
            if record.first_started is None or record.first_started.owner != lease.owner:
                return None  # someone else's first start won: never run it twice
        if record.state is ProcessState.starting:
            try:
                record = self.registry.record_started(process_id, self.registry.now_ms())
            except InvalidTransition:
                record = self.registry.get(process_id)  # started or finished meanwhile
                if record.state is not ProcessState.running:
                    return None
        return record, claim

    def _execute(self, record: ProcessRecord, claim: _Claim, tally: _Tally) -> None:
        result: RunResult | None = None
        error: Exception | None = None
        with (
            self._cancel_scope() as cancel,
            _Renewal(self.registry, claim.lease, self.timings, cancel, claim.since) as renewal,
        ):
            try:
                result = _checked(self.runner(record, renewal.lease, cancel))
            except Exception as exc:
                error = exc
        if renewal.lost or renewal.lapsed:
            tally.lost.append(record.id)  # fenced off: the new holder owns it; write nothing
        elif error is not None and cancel.is_set():
            self._stand_down(record, renewal.lease, tally)
        else:
            self._record_outcome(renewal.lease, result, error, tally)

    def _record_outcome(
        self, lease: Lease, result: RunResult | None, error: Exception | None, tally: _Tally
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
            self.registry.record_completed(
                process_id,
                ProcessState.failed,
                TerminalReason.failed,
                diagnostic=diagnostic_of(error),
                lease=lease,
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
        )

    def _stand_down(self, record: ProcessRecord, lease: Lease, tally: _Tally) -> None:
        """The worker was stopped mid-run and its runner gave up: hand rerunnable work back at
        once; record owner_bound work as stopped, since nobody may run it again."""
        try:
            if record.disposition is RecoveryDisposition.owner_bound:
                self.registry.record_completed(
                    record.id,
                    ProcessState.terminated,
                    TerminalReason.runner_shutdown,
                    lease=lease,
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
