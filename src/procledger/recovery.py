"""Recovery by declared disposition: the sweep, the owner drain, self-fencing runs.

See docs/design.md §3.6.

A ``RecoveryWorker`` takes the non-terminal processes whose lease is free, one at a time in id
order and passing over what other workers are taking (``claim_next_free``), then those whose
live lease a provably dead holder keeps, and does for each what its declared disposition
allows -- nothing more::

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

import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, final

from pydantic import Field, JsonValue

from procledger.adapters.outbox import Outbox, default_outbox
from procledger.adapters.sql import leases as lease_rows
from procledger.adapters.sql import records as record_rows
from procledger.application.lease_keeper import LeaseKeeper, Renewal
from procledger.application.leases import FreeProcess, lease_from_row
from procledger.application.outbox import deliver_outbox, store_key, this_host_id
from procledger.domain.diagnostics import clip_diagnostic
from procledger.domain.errors import (
    AuthorityRejected,
    ExecutionError,
    Interrupted,
    InvalidTransition,
    LeaseLost,
    NotFound,
    ProcessLifecycleValidationError,
    SpawnError,
)
from procledger.domain.leases import (
    Acquired,
    CompletionAuthority,
    Lease,
    LeaseOwner,
    LeaseTimings,
)
from procledger.domain.model import Frozen
from procledger.domain.records import OutputSummary, ProcessRecord
from procledger.domain.vocabulary import (
    ProcessState,
    RecoveryDisposition,
    TerminalReason,
)
from procledger.projections.records import read_record
from procledger.supervisor import orphans, os_seam
from procledger.supervisor.capture import (
    DEFAULT_OUTPUT_LIMIT,
    Capture,
    no_capture,
    open_capture,
    salvage,
)
from procledger.supervisor.decide import event_ids
from procledger.supervisor.execution import StopPolicy, run_streaming
from procledger.supervisor.readiness import (
    NotReadyInTime,
    ReadinessWatch,
    StopOnTimeout,
    watching,
)

if TYPE_CHECKING:
    from procledger.adapters.sql.store import Tx
    from procledger.application.registry import ProcessRegistry

__all__ = [
    "Action",
    "DefaultRunner",
    "Engine",
    "Plan",
    "RecoveryWorker",
    "RunFailed",
    "RunResult",
    "Runner",
    "SweepReport",
    "plan",
    "recovery_owner_id",
]

log = logging.getLogger("procledger.recovery")

EXTERNALLY_OWNED: Final = RecoveryDisposition.externally_owned
RECOVERY_MARK: Final = ":recovery:"
"""Separates a worker's owner id from the attempt id in an attempt's ``owner_id``."""


@final
class RunResult(Frozen):
    """What a runner returns: recorded as ``completed/exited`` with this code and value, and
    (the default runner's commands) the run's captured output facts (docs/design.md §14):
    ``output`` the summary, ``tails`` the base64 last bytes of each stream."""

    exit_code: int = 0
    value: JsonValue = None
    output: OutputSummary | None = None
    tails: dict[str, str] = Field(default_factory=dict)


_OutputFacts = tuple[OutputSummary | None, dict[str, str]]
"""A run's output summary (None: not captured here) and base64 tails, for its terminal."""


@final
class RunFailed(ExecutionError):
    """A runner's failure that comes with the output its run captured (docs/design.md §14):
    the attempt is recorded as the failure of ``cause`` -- the same diagnostic, the same
    stand-down when the worker stops -- and its terminal carries ``output`` and ``tails``, as a
    run that exited would. The default runner raises it for every failure after the command
    started: a signal death nobody asked for, an interruption, a read failure."""

    def __init__(
        self, cause: Exception, output: OutputSummary | None, tails: dict[str, str]
    ) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.output = output
        self.tails = tails


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

    @property
    def claims(self) -> bool:
        """Whether carrying it out takes the process's lease."""
        return self.action is Action.run or (self.action is Action.abandon and not self.authority)


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


def _failure_reason(error: Exception) -> TerminalReason:
    """``ready_timeout`` for a re-run stopped past its ready timeout, else ``failed``."""
    if isinstance(error, RunFailed):
        error = error.cause
    if isinstance(error, NotReadyInTime):
        return TerminalReason.ready_timeout
    return TerminalReason.failed


def diagnostic_of(error: BaseException) -> str:
    """``"<Type>: <message>"`` as a record can hold it (``clip_diagnostic``); a ``RunFailed``
    is described by its cause."""
    if isinstance(error, RunFailed):
        error = error.cause
    return clip_diagnostic(f"{type(error).__name__}: {error}".rstrip(": "))


def _output_facts(error: BaseException | None) -> _OutputFacts:
    """The output facts a failure carries (none but a ``RunFailed``'s)."""
    if isinstance(error, RunFailed):
        return error.output, error.tails
    return None, {}


# -- the default runner ---------------------------------------------------------------------------


class DefaultRunner:
    """Runs ``command`` inputs (environment from ``load_env``, the registration's ``cwd``;
    output captured as the Supervisor captures it, docs/design.md §14, but not passed on) and
    ``engine`` inputs with the engine registered for their kind. An unknown engine, a command
    killed by a signal nobody asked for, or ``external`` input raises, so the attempt is
    recorded ``completed/failed``; a command that ran raises ``RunFailed``, so that terminal
    (or an owner_bound run's ``runner_shutdown`` when the worker stops) still carries the
    output it captured. Engines have no stdout of their own: nothing is captured for them.

    ``output_dir``: the output root (``<state dir>/output`` when omitted); ``output_limit``:
    bytes kept per process (0: none); ``capture`` false: keep nothing."""

    def __init__(
        self,
        registry: ProcessRegistry,
        engines: Mapping[str, Engine],
        stop: StopPolicy,
        *,
        output_dir: Path | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        capture: bool = True,
    ) -> None:
        self.registry = registry
        self.engines = dict(engines)
        self.stop = stop
        self.output_dir = output_dir
        self.output_limit = output_limit
        self.capture = capture

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

    def _environment(self, record: ProcessRecord) -> dict[str, str] | None:
        """The stored environment; ``None`` (inherit this worker's) where the process was
        started without an explicit one, whose values were never stored."""
        if not record.env_ref:
            return None
        try:
            return self.registry.load_env(record.env_ref)
        except NotFound:
            return None

    def _command(self, record: ProcessRecord, cancel: threading.Event) -> RunResult:
        """Run a command input as the Supervisor would -- its output captured and, when it
        declared readiness probes, watched: ``ready`` recorded, or stopped past its ready
        timeout (``NotReadyInTime``, recorded ``failed``/``ready_timeout``; §15.2)."""
        argv = list(record.input.argv or ())
        env = self._environment(record)
        capture = self._capture_for(record.id)
        stdout, stderr = capture.sinks() if capture is not None else (_discard, _discard)
        watch = _watch_for(record)
        if watch is not None:
            stdout, stderr = watch.sink(0, stdout), watch.sink(1, stderr)
            env = watch.child_env(dict(os.environ if env is None else env))
        stop = StopOnTimeout(cancel)
        registry = self.registry
        ready = lambda probes: registry.record_ready(record.id, registry.now_ms(), probes=probes)  # noqa: E731
        marker = event_ids(record.id, record.registration_hash).run_marker
        self._stop_leftovers(record, marker)
        try:
            with watching(watch, ready, stop):
                ran = run_streaming(
                    argv, stdout, cwd=record.input.cwd, env=env, stop=self.stop, cancel=stop,
                    stderr=stderr, marker=marker,
                )  # fmt: skip
        except SpawnError:
            _finished(capture, watch)
            raise  # nothing ran, so nothing was written
        except Interrupted as error:
            cause: Exception = error
            if stop.why is not None:
                cause = NotReadyInTime(f"process {record.id!r}: {stop.why}")
            raise RunFailed(cause, *_finished(capture, watch)) from None
        except Exception as error:
            raise RunFailed(error, *_finished(capture, watch)) from error
        finally:
            summary, tails = _finished(capture, watch)  # closes the files on every way out
        if ran.returncode < 0:
            name = signal.Signals(-ran.returncode).name
            killed = ExecutionError(f"process {record.id!r}: {argv[0]!r} was killed by {name}")
            raise RunFailed(killed, summary, tails)
        return RunResult(exit_code=ran.returncode, output=summary, tails=tails)

    def _stop_leftovers(self, record: ProcessRecord, marker: str) -> None:
        """Stop what an earlier run of this process left running on this host before running
        it again: a worker (or supervisor) that was SIGKILLed leaves its command alive, and
        the lease this attempt holds means that run is no longer anybody's -- without this, a
        rerunnable command would run twice at once. Found by the run marker every run's
        environment carries (``os_seam.RUN_MARKER``). Said on the log, naming the pids (an
        exited terminal carries no diagnostic)."""
        stopped, survivors = os_seam.stop_marked(marker, self.stop.grace_s)
        if stopped:
            log.warning(
                "process %r: stopped what an earlier run left running on this host before "
                "running it again (OS pids %s%s)",
                record.id,
                ", ".join(map(str, stopped)),
                f"; {', '.join(map(str, survivors))} outlived SIGKILL" if survivors else "",
            )

    def _capture_for(self, process_id: str) -> Capture | None:
        """The re-run's capture, in the folder the Supervisor would use for this process (so
        ``read_output`` and ``procledger logs`` find it); None when capture is off."""
        if not self.capture:
            return None
        return open_capture(
            self.registry, self.output_dir, process_id, self.output_limit, None, quiet=True
        )


def _watch_for(record: ProcessRecord) -> ReadinessWatch | None:
    """The re-run's readiness probes, as its registration declared them (§15.4)."""
    if record.readiness is None:
        return None
    return ReadinessWatch(record.readiness, record.input.cwd or os.getcwd())


def _discard(chunk: bytes) -> None:
    """Output of a run without capture: dropped."""


def _finished(
    capture: Capture | None, watch: ReadinessWatch | None
) -> tuple[OutputSummary, dict[str, str]]:
    """The run's output facts, its files and probes closed (again: both are idempotent)."""
    if watch is not None:
        watch.close()
    return no_capture(this_host_id()) if capture is None else capture.finish()


def default_stop_policy(timings: LeaseTimings) -> StopPolicy:
    """SIGTERM, then SIGKILL after half a renewal period: a fenced-off tree stops well before
    the lease it ran under could be taken over."""
    return StopPolicy((signal.SIGTERM,), grace_s=timings.renew_ms / 2000)


# -- lease renewal while a runner runs ------------------------------------------------------------


class _RenewalThread:
    """Drives one attempt's ``LeaseKeeper`` on a thread of its own until the ``with`` ends.

    Gives up -- sets ``cancel`` and ``lost`` -- when a renewal is refused, or when the keeper
    says the lease is lapsing (a paused worker, or a store that kept failing): the runner then
    has half a renewal period to stop its tree, and the lease still has at least a whole one.
    """

    def __init__(self, keeper: LeaseKeeper, cancel: threading.Event) -> None:
        self.keeper = keeper
        self.lost = False
        self._cancel = cancel
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"procledger-renew:{keeper.lease.process_id}", daemon=True
        )

    def __enter__(self) -> _RenewalThread:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._done.wait(self.keeper.wait_s(time.monotonic())):
            if not _keep_alive(self.keeper, time.monotonic()):
                self.lost = True
                self._cancel.set()
                return


def _keep_alive(keeper: LeaseKeeper, now: float) -> bool:
    """Renew if due; False once the lease is no longer safely ours (refused, or lapsing)."""
    if keeper.is_lapsing(now):
        return False  # paused, or the store kept failing: too late to renew safely
    if not keeper.is_due(now):
        return True
    return keeper.renew(now) is not Renewal.lost


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
        self.runner: Runner = runner or DefaultRunner(
            registry, engines or {}, stop or default_stop_policy(timings), output_dir=output_dir
        )
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._cancels: set[threading.Event] = set()
        self._outbox = outbox
        self._output_dir = output_dir

    # -- public ---------------------------------------------------------------------------------

    def sweep(self) -> SweepReport:
        """One pass over the non-terminal processes, doing for each what its disposition
        allows (the module docstring's table) and nothing more.

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
        tally = _Tally()
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
        tally = _Tally()
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
        """Stop for good, from any thread (not from a signal handler, which could deadlock on
        the worker's lock): running attempts are cancelled (their trees stopped), rerunnable
        work is handed back at once, and ``sweep``/``serve`` return after them."""
        self._stopping.set()
        with self._lock:
            for cancel in self._cancels:
                cancel.set()

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
        return self.registry.store.attempt(record_rows.non_terminal_ids)

    def _sweep_free(self, tally: _Tally) -> None:
        """Every process whose lease is free, once, taking each as ``plan`` says."""
        after = ""
        while not self._stopping.is_set():
            since, decided = time.monotonic(), list[Plan]()
            found = self.registry.claim_next_free(
                after,
                self._incarnation(),
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

    def _settle(self, found: FreeProcess, decision: Plan, since: float, tally: _Tally) -> None:
        record, lease = found.record, found.acquired
        if record is None or (decision.claims and lease is None):
            tally.skipped.append(found.process_id)  # damaged, or claimed by another meanwhile
        elif lease is not None:
            keeper = LeaseKeeper(self.registry, lease, self.timings, since=since, log=log)
            if decision.action is Action.run:
                self._run_claimed(keeper, record, tally)  # read under the claim's row lock
            else:
                assert decision.reason is not None
                self._abandon_with(record, lease, decision.reason, decision.evidence, tally)
        elif decision.action is Action.abandon:
            self._abandon(record, found.lapsed, decision, tally)
        else:
            tally.skipped.append(found.process_id)

    def _sweep_dead_holders(self, tally: _Tally) -> None:
        """Visit the processes whose live lease is kept by a holder provably dead on this host
        (a crashed supervisor, before its lease expires); live holders are not visited."""
        now = self.registry.now_ms()
        rows = self.registry.store.attempt(lambda tx: lease_rows.held(tx, now))
        for row in rows:
            if self._stopping.is_set():
                return
            holder = lease_from_row(str(row["process_id"]), row)
            if self.registry.probe.provably_dead(holder.owner, self.owner):
                self._recover(holder.process_id, tally)

    def _facts(self, process_id: str) -> tuple[ProcessRecord, Lease | None, bool] | None:
        """The fresh record, its stored lease (as ``get_lease`` returns it) and whether the
        holder is provably dead; ``None`` if the process was pruned since the walk began.

        One read transaction of the read model and the lease table, rather than ``get`` and
        ``get_lease``: several workers walk the same ids, and most of their visits end here.
        A read, so a transaction lost mid-way runs again (``Store.attempt``)."""
        record, row = self.registry.store.attempt(lambda tx: _record_and_lease(tx, process_id))
        if record is None or record.state.is_terminal:
            return None if record is None else (record, None, False)
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

    def _claim(self, process_id: str, observed: Lease | None) -> LeaseKeeper | None:
        """Claim as a fresh incarnation, or reclaim from ``observed`` (a provably dead holder);
        the keeper's local deadline counts from just before the claim."""
        claimant, ttl, since = self._incarnation(), self.timings.ttl_ms, time.monotonic()
        try:
            if observed is None:
                outcome = self.registry.claim_lease(process_id, claimant, ttl)
            else:
                outcome = self.registry.reclaim_lease(process_id, claimant, observed, ttl)
        except InvalidTransition:  # AlreadyTerminal: it ended since we looked
            return None
        if not isinstance(outcome, Acquired):
            return None
        return LeaseKeeper(self.registry, outcome.lease, self.timings, since=since, log=log)

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
        keeper = self._claim(process_id, lease if decision.reclaim else None)
        if keeper is None:
            tally.skipped.append(process_id)
            return
        self._abandon_with(record, keeper.lease, reason, decision.evidence, tally)

    def _abandon_with(
        self,
        record: ProcessRecord,
        lease: Lease,
        reason: TerminalReason,
        evidence: LeaseOwner | None,
        tally: _Tally,
    ) -> None:
        """Abandon with ``lease``; a dead holder's run keeps what its capture left here, and a
        child of it still running here is stopped first (``_stop_orphan``)."""
        process_id = lease.process_id
        diagnostic = self._stop_orphan(record)
        output, tails = salvage(self.registry, record, self._output_dir)
        try:
            self.registry.record_abandoned(
                process_id,
                reason,
                owner=evidence,
                lease=lease,
                diagnostic=diagnostic,
                output=output,
                tails=tails,
            )
        except LeaseLost:
            tally.lost.append(process_id)
        except InvalidTransition:  # finished between our look and our claim
            self.registry.release_lease(lease)
            tally.skipped.append(process_id)
        else:
            tally.abandoned.append(process_id)

    def _stop_orphan(self, record: ProcessRecord) -> str | None:
        """A recorded child still running on this host (pid and start time) outlived the holder
        whose process is being abandoned: its tree is stopped as ``restore`` does (SIGTERM,
        SIGKILL after the stop grace) and the diagnostic says so -- the ledger never calls a
        process abandoned while its child runs on unmentioned (docs/design.md §3.6). So is a
        child spawned for a ``starting`` one, found by its run marker (``stop_unrecorded``)."""
        grace = default_stop_policy(self.timings).grace_s
        if orphans.find_live_child(record) is None:
            unrecorded = orphans.stop_unrecorded(record, grace, "sweep")
            return None if unrecorded is None else clip_diagnostic(unrecorded)
        stop = orphans.stop_tree(record, (signal.SIGTERM,), grace, escalate=True)
        return clip_diagnostic(orphans.describe_stop(record, stop, "sweep"))

    def _drain_one(self, process_id: str, tally: _Tally) -> None:
        facts = self._facts(process_id)
        if facts is None or not self._drainable(facts[0]):
            tally.skipped.append(process_id)
            return
        record, lease, dead = facts
        if lease is not None and lease.is_live(self.registry.now_ms()) and not dead:
            tally.skipped.append(process_id)  # a live holder is still executing it
            return
        keeper = self._claim(process_id, lease if dead else None)
        if keeper is None:
            tally.skipped.append(process_id)
            return
        self._abandon_with(record, keeper.lease, TerminalReason.owner_drain, self.owner, tally)

    def _drainable(self, record: ProcessRecord) -> bool:
        return (
            not record.state.is_terminal
            and record.disposition is RecoveryDisposition.owner_bound
            and record.first_started is not None
            and is_owned_by(record.first_started.owner.owner_id, self.owner.owner_id)
        )

    # -- running ----------------------------------------------------------------------------------

    def _attempt(self, record: ProcessRecord, observed: Lease | None, tally: _Tally) -> None:
        keeper = self._claim(record.id, observed)
        if keeper is None:
            tally.skipped.append(record.id)
            return
        self._run_claimed(keeper, None, tally)

    def _run_claimed(self, keeper: LeaseKeeper, fresh: ProcessRecord | None, tally: _Tally) -> None:
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
        if not _still_runnable(record):
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

    def _execute(self, record: ProcessRecord, keeper: LeaseKeeper, tally: _Tally) -> None:
        result: RunResult | None = None
        error: Exception | None = None
        with self._cancel_scope() as cancel, _RenewalThread(keeper, cancel) as renewal:
            try:
                result = _checked(self.runner(record, keeper.lease, cancel))
            except Exception as exc:
                error = exc
        if renewal.lost or keeper.is_lapsed(time.monotonic()):
            tally.lost.append(record.id)  # fenced off: the new holder owns it; write nothing
        elif error is not None and cancel.is_set():
            self._stand_down(record, keeper.lease, tally, _output_facts(error))
        else:
            self._record_outcome(keeper.lease, result, error, tally)

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
            output, tails = (
                (result.output, result.tails) if result is not None else _output_facts(error)
            )
            self.registry.record_completed(
                process_id,
                ProcessState.failed,
                _failure_reason(error),
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
        self, record: ProcessRecord, lease: Lease, tally: _Tally, facts: _OutputFacts
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


def _record_and_lease(tx: Tx, process_id: str) -> tuple[ProcessRecord | None, Any]:
    """The process's record and, unless it has ended (or is gone), its ``leases`` row: one
    read transaction, safe to run again."""
    record = read_record(tx, process_id)
    if record is None or record.state.is_terminal:
        return record, None
    return record, lease_rows.lease_row(tx, process_id)


def _checked(result: object) -> RunResult:
    if not isinstance(result, RunResult):
        raise TypeError(f"a runner must return a RunResult, not {type(result).__name__}")
    return result
