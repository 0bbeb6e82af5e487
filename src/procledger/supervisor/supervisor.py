"""The Supervisor: real child processes as domain events (docs/design.md §6.2).

Every process has exactly one **owner thread** from a successful spawn on: it waits for the
child (``OwnedChild.wait``), decides the terminal from how the child ended and what was asked of
it (``decide.outcome``), records it with the lease — which releases the lease in the same
transaction — and only then publishes the completion notification. ``stop``, ``shutdown``, a
lost lease and stop requests made elsewhere only *signal* the tree and note what they asked;
none of them writes a terminal, so exit, stop and shutdown can race freely and still produce
exactly one terminal, one lease release and one notification.

One **ticker thread** per supervisor (alive while it has running processes) keeps each run's
lease with its ``LeaseKeeper`` (every ``renew_ms``, sooner after a store failure; a refused
renewal kills the tree) and, twice a second, notices ``stop_requested`` events written by others
(``registry.request_stop``, ``procledger stop``) and carries them out with the supervisor's own
stop policy. Unlike a recovery attempt, a supervised run does not fence itself off by its local
clock: only the store's refusal ends it.

Durable writes of a supervised process, in order: ``register_claimed`` (the registration, the
lease and ``first_started`` in one transaction: ``starting`` is durable before anything runs), the
handle row (only when a completion notification is to be published: ``restore`` must then
publish the same one), then after the spawn ``started`` or ``backgrounded``, and finally the
terminal (``completed``, releasing the lease in the same transaction) -- three transactions for
a run without notification. Each lifecycle write carries an id derived from the registration
(``decide.event_ids``), so retries never append twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import logging
import math
import os
import signal
import subprocess
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, NamedTuple, Protocol, TypeVar, final

from procledger.adapters.outbox import Outbox, OutboxEntry, default_outbox
from procledger.application.lease_keeper import LeaseKeeper, Renewal
from procledger.application.outbox import (
    deliver_outbox,
    entry_write,
    record_entry,
    store_key,
    this_host_id,
)
from procledger.application.unit_of_work import outcome_of
from procledger.domain.attempts import attempt_id
from procledger.domain.diagnostics import clip_diagnostic
from procledger.domain.errors import (
    InvalidTransition,
    LeaseLost,
    NotFound,
    ProcledgerError,
    SpawnError,
    StoreError,
    SupervisorClosed,
)
from procledger.domain.leases import Acquired, Lease, LeaseOwner, LeaseTimings
from procledger.domain.notification import ProcessCompletionNotification
from procledger.domain.records import OsFacts, OutputSummary, ProcessRecord
from procledger.domain.registration import (
    ENV_REF_PREFIX,
    Originator,
    ProcessInput,
    ProcessRegistration,
    SessionScope,
    env_ref_for,
)
from procledger.domain.service import (
    Readiness,
    RestartPlan,
    RestartPolicy,
    backoff_delay,
    plan_restart,
)
from procledger.domain.vocabulary import (
    MAX_LEDGER_INT,
    ProcessState,
    ProcessStatus,
    RecoveryDisposition,
    TerminalReason,
)
from procledger.projections.filters import ProcessListFilter
from procledger.supervisor import handles as handle_table
from procledger.supervisor import orphans, os_seam
from procledger.supervisor.capture import (
    DEFAULT_OUTPUT_LIMIT,
    Capture,
    no_capture,
    open_capture,
    salvage,
)
from procledger.supervisor.decide import (
    STOP_REASONS,
    EventIds,
    Outcome,
    event_ids,
    mode_policy,
    outcome,
    request_policy,
    spawn_failure,
    start_refusal,
)
from procledger.supervisor.execution import (
    Consumer,
    OwnedChild,
    StopPolicy,
    checked_argv,
)
from procledger.supervisor.modes import StopMode
from procledger.supervisor.owners import OwnerThreads
from procledger.supervisor.readiness import ReadinessWatch
from procledger.supervisor.services import BackoffEnd, Service, backoff_wait

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = ["ProcessHandle", "Settle", "StopMode", "Supervisor", "Watch"]

log = logging.getLogger("procledger.supervisor")

STOP_POLL_S: Final = 0.5
"""How often the ticker looks for stop requests made elsewhere (the contract says within 1 s)."""

RETRY_FIRST_S: Final = 0.1
RETRY_MAX_S: Final = 5.0
"""A terminal write the store failed is retried (with its stable id) for as long as the
supervisor runs: first after ``RETRY_FIRST_S``, doubling up to ``RETRY_MAX_S``."""

Stdin = Literal["inherit", "null"] | Path | bytes | int
"""What a child reads: ``"null"`` (``/dev/null``), ``"inherit"`` (the supervisor's own stdin:
a pipe or a file — a terminal only if the child never reads it, since the child runs in a
process group of its own and a read from the terminal would stop it), a file's ``Path``,
``bytes`` written once and then closed, or an open file descriptor (e.g. the read end of a
pipe the caller feeds; the caller keeps and closes its own copy)."""

Notice = Callable[[str], None]
"""Receives the lines a person should see while an outcome waits for the store."""


Watch = Callable[[OwnedChild, "Settle"], None]
"""Who waits for a started child (docs/design.md §6.2, §17). The default starts one owner
thread per child that calls ``settle`` at once (``settle`` then blocks in ``OwnedChild.wait``).
An event loop instead waits for ``child.watched()`` descriptors itself, calls
``child.advance()`` until it returns True, and only then calls ``settle`` (which no longer
waits for the child) in a worker thread: one code path records the outcome either way."""

_SessionId = uuid.UUID | str
_NotifyTo = tuple[uuid.UUID, uuid.UUID]
"""Where a completion notification goes: (session id, loop id)."""


class CompletionNotifier(Protocol):
    """What the Supervisor needs of a notifier (``procledger.notifications.Notifier``)."""

    def notify_process_completion(self, notification: ProcessCompletionNotification) -> Any: ...


@final
@dataclass(frozen=True, slots=True)
class ProcessHandle:
    """What ``start`` returns: the opaque ``handle`` (22 URL-safe characters that encode
    nothing, so it can be handed to an agent or a log without leaking a pid or a path) and the
    ``process_id`` in the ledger. Pass either the handle or this object to ``wait``/``stop``."""

    handle: str
    process_id: str


@dataclass(frozen=True, slots=True)
class _StartRequest:
    """``start``'s arguments, checked and normalised before anything is written."""

    args: list[str]
    process_id: str | None
    cwd: str | os.PathLike[str] | None
    env: Mapping[str, str] | None
    stdin: Stdin
    stdout: Consumer | None
    background: bool
    disposition: RecoveryDisposition
    session_id: uuid.UUID | None
    loop_id: uuid.UUID | None
    capture: bool = True
    output_limit: int = DEFAULT_OUTPUT_LIMIT
    ready: Readiness | None = None
    restart: RestartPolicy | None = None
    attempt_of: str | None = None
    attempt: int | None = None

    @property
    def notify_to(self) -> _NotifyTo | None:
        """A completion notification is published only where both ids name its target."""
        if self.session_id is None or self.loop_id is None:
            return None
        return (self.session_id, self.loop_id)


@dataclass(frozen=True, slots=True)
class _Ticket:
    """A registered, leased process about to be spawned: what its writes and its completion
    notification are addressed with."""

    handle: str
    process_id: str
    ids: EventIds
    notify_to: _NotifyTo | None
    registration_hash: str
    capture: Capture | None = None


class _Prepared(NamedTuple):
    """A process registered, leased and stamped, not yet spawned."""

    ticket: _Ticket
    keeper: LeaseKeeper
    workdir: str


class _Run:
    """One supervised process from spawn to terminal; shared by its owner thread, the ticker
    and stoppers. ``lock`` guards the fields that decide the terminal."""

    def __init__(self, ticket: _Ticket, keeper: LeaseKeeper, child: OwnedChild) -> None:
        self.handle = ticket.handle
        self.process_id = ticket.process_id
        self.ids = ticket.ids
        self.notify_to = ticket.notify_to
        self.ticket = ticket
        self.keeper = keeper
        self.child = child
        self.lock = threading.Lock()
        self.claimed: set[TerminalReason] = set()  # stop reasons someone here acts on
        self.requested: list[TerminalReason] = []  # durable stop requests, for the outcome
        self.shutdown = False
        self.ended = False  # the child's status is known: no more stops are taken
        self.returncode: int | None = None
        self.lease_lost = False
        self.seen_change_seq = 0
        self.done = threading.Event()
        self.record: ProcessRecord | None = None
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.watch: ReadinessWatch | None = None
        self.ready_timeout: str | None = None  # why the probes failed; the tree was stopped
        self.ready = False
        self.settled = threading.Event()  # ready, or ended: what ``wait_ready`` waits for
        self.spawned_at = time.monotonic()
        self.ready_at: float | None = None
        self.service: Service | None = None

    @property
    def renewing(self) -> bool:
        """Whether the ticker still keeps this run's lease (read without the lock: a stale
        answer costs one renewal more or less)."""
        return not (self.ended or self.lease_lost)


FINISHED_KEPT: Final = 1_024
"""Finished runs a supervisor keeps whole; older ones shrink to an ``_Ended``."""


@dataclass(frozen=True, slots=True)
class _Ended:
    """What a supervisor keeps of a run that finished ``FINISHED_KEPT`` runs ago: enough to
    answer ``wait``, ``stop`` and ``returncode`` for its handle (the record is in the ledger).
    A whole ``_Run`` holds about 30 KB (its records, its child, its lease keeper); a harness
    that supervises for weeks would otherwise keep every run it ever started."""

    process_id: str
    returncode: int | None


@final
class Settle:
    """A run's one completion path: wait for the child (``OwnedChild.wait``), record its terminal
    (outbox first, then the write that releases the lease) and publish its notification. It may
    block; call it once (``settle()``), on a thread that may. Runs whose children have all
    ended settle together with ``Settle.together``: their terminals in one write."""

    __slots__ = ("_run", "_supervisor", "handle")

    def __init__(self, supervisor: Supervisor, run: _Run) -> None:
        self._supervisor, self._run = supervisor, run
        self.handle = run.handle
        """The run's handle (what ``start`` returned for it)."""

    def __call__(self) -> None:
        self._supervisor._own_all([self._run])

    @staticmethod
    def together(settles: Sequence[Settle]) -> None:
        """Each of ``settles``, with one terminal write per supervisor for all of them."""
        by_supervisor: dict[int, tuple[Supervisor, list[_Run]]] = {}
        for settle in settles:
            entry = by_supervisor.setdefault(id(settle._supervisor), (settle._supervisor, []))
            entry[1].append(settle._run)
        for supervisor, runs in by_supervisor.values():
            supervisor._own_all(runs)


class Supervisor:
    """Starts processes as this ``owner``, and turns what they do into lifecycle events.

    Thread-safe. Use it as a context manager (or call ``shutdown``) so no process outlives it:
    a tree left running after its supervisor is gone would hold a lease nobody renews, and
    recovery would record it ``lost`` while it still runs.
    """

    def __init__(
        self,
        registry: ProcessRegistry,
        *,
        owner: LeaseOwner,
        notifier: CompletionNotifier | None = None,
        stop: StopPolicy = StopPolicy(),  # noqa: B008 -- an immutable value
        timings: LeaseTimings = LeaseTimings(),  # noqa: B008 -- an immutable value
        outbox: Outbox | None = None,
        notice: Notice | None = None,
        subreaper: bool = False,
        output_dir: Path | None = None,
        watch: Watch | None = None,
    ) -> None:
        """Supervise as ``owner`` (the identity leases and ``restore`` go by).

        Args:
            registry: the ledger every lifecycle event is written to.
            owner: who holds the leases; ``restore`` takes over only this owner's processes.
            notifier: publishes completion notifications (none are published without one).
            stop: how stop requests made elsewhere, failures and ``shutdown`` stop a tree.
            timings: the lease ttl and renewal period of every process started here.
            outbox: where outcomes wait for the store (docs/design.md §6.3); the user's
                (``<state dir>/outbox``) when omitted; none for an in-memory store.
            notice: called (on an owner thread) with one line when an outcome starts waiting
                for the store and one when it got through; the library prints nothing itself.
            subreaper: mark this process a child subreaper (Linux) while the supervisor
                lives, so orphaned descendants re-parent to it and a stop can reap them.
                Process-wide: for programs that own their children, like ``procledger run``.
            output_dir: where captured output goes, one folder per process
                (docs/design.md §14); ``<state dir>/output`` when omitted.
            watch: who waits for each child (``Watch``; ``procledger.aio`` passes its loop's).
        """
        self._registry, self._store = registry, store_key(registry.location)  # realpath: once
        self._watch, self._output_dir = watch, output_dir
        self._outbox, self._notice = outbox, notice
        self._subreaper = subreaper and _Subreaper.acquire()
        self._owner, self._notifier = owner, notifier
        self._stop_policy, self._timings = stop, timings
        self._lock = threading.Condition()
        self._runs: dict[str, _Run] = {}
        self._active: dict[str, _Run] = {}
        self._finished: deque[str] = deque()  # handles of whole finished runs, oldest first
        self._ended: dict[str, _Ended] = {}
        self._starting, self._closed = 0, False
        self._ticker: threading.Thread | None = None
        self._ticker_until = 0.0  # when the ticker wakes up next (monotonic)
        self._wake = threading.Event()
        self._owners, self._helpers = OwnerThreads(), list[threading.Thread]()
        self._services: dict[str, Service] = {}

    @property
    def owner(self) -> LeaseOwner:
        """The identity this supervisor holds leases as."""
        return self._owner

    @property
    def stop_policy(self) -> StopPolicy:
        """How this supervisor stops a tree for requests made elsewhere and for ``shutdown``."""
        return self._stop_policy

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Shut down (see ``shutdown``): no process outlives the ``with`` block."""
        self.shutdown()

    # -- start ---------------------------------------------------------------------------------

    def start(
        self,
        argv: Sequence[str],
        *,
        process_id: str | None = None,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        stdin: Stdin = "null",
        stdout: Consumer | None = None,
        background: bool = False,
        disposition: RecoveryDisposition = RecoveryDisposition.owner_bound,
        session_id: _SessionId | None = None,
        loop_id: _SessionId | None = None,
        capture: bool = True,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        ready: Readiness | None = None,
        restart: RestartPolicy | None = None,
    ) -> ProcessHandle:
        """Run ``argv`` under this supervisor; returns once the child runs and that is recorded.
        ``starting`` is durable before the spawn; a retried start never runs a program twice.

        Args:
            process_id: the ledger id; a time-ordered one is minted when omitted.
            stdin: what the child reads (``Stdin``); ``"null"``, ``/dev/null``, by default.
            stdout: receives raw output chunks on the owner thread; ``None``: inherited.
            disposition: what recovery may do if this supervisor dies (§3.6; env: §6.2).
            session_id, loop_id: where the completion notification goes (both, or none sent).
            capture, output_limit: keep the output (§14), this many bytes (0: none) at most.
            ready: readiness probes (§15): the ``ready`` fact once all hold; past its
                ``timeout_s`` the tree is stopped and the run ends ``failed``/``ready_timeout``.
            restart: start the command again as new attempts when it ends (§15); the handle
                then names the service (``wait`` and ``stop`` act on its current attempt).

        Raises:
            TypeError, ValueError, OSError (a ``stdin`` file): nothing was written.
            SupervisorClosed: ``shutdown`` has begun.
            InvalidTransition: ``process_id`` was started before (``AlreadyTerminal``: ended).
            LeaseLost: another live owner holds ``process_id``.
            SpawnError: the program could not be started; ``failed`` is recorded first.
        """
        request = _checked_request(
            argv, process_id=process_id, cwd=cwd, env=env, stdin=stdin, stdout=stdout,
            background=background, disposition=disposition, session_id=session_id,
            loop_id=loop_id, capture=capture, output_limit=output_limit, ready=ready,
            restart=restart,
        )  # fmt: skip
        with self._start_slot(), _stdin_source(request.stdin) as source:
            return _raised(self._start_opened([(request, source)])[0])

    @contextmanager
    def _start_slot(self) -> Iterator[None]:
        """Count a start in progress, so ``shutdown`` waits for it instead of missing its run."""
        with self._lock:
            if self._closed:
                raise SupervisorClosed(f"supervisor {self._owner.owner_id!r} is shut down")
            self._starting += 1
        try:
            yield
        finally:
            with self._lock:
                self._starting -= 1
                self._lock.notify_all()

    def start_all(
        self, starts: Sequence[tuple[Sequence[str], Mapping[str, Any]]]
    ) -> list[ProcessHandle | Exception]:
        """Several starts at once: each ``(argv, options)`` as ``start(argv, **options)``
        makes it, with its own outcome -- its handle, or the error ``start`` would have raised
        (nothing written for a bad argument). Their writes share transactions: the
        registrations one, the ``started``/``backgrounded`` facts another, the children
        spawned one after another in between; a burst of starts costs a fraction of one by
        one (docs/design.md §6.2).

        Raises:
            SupervisorClosed: ``shutdown`` has begun (nothing was started).
        """
        with self._start_slot(), contextlib.ExitStack() as sources:
            opened = [
                outcome_of(functools.partial(_opened, sources, argv, options))
                for argv, options in starts
            ]
            return _through(opened, self._start_opened)

    def _start_opened(
        self, items: Sequence[tuple[_StartRequest, int | None]]
    ) -> list[ProcessHandle | Exception]:
        """Checked starts with their stdin open: one with a restart policy as a service of its
        own (§15), the others together."""
        services = [
            outcome_of(functools.partial(self._start_service, request, request.restart, source))
            if request.restart is not None
            else None
            for request, source in items
        ]
        plain = iter(
            self._start_all([i for i, s in zip(items, services, strict=True) if s is None])
        )
        return [next(plain) if service is None else service for service in services]

    def _start_all(
        self, items: Sequence[tuple[_StartRequest, int | None]]
    ) -> list[ProcessHandle | Exception]:
        """The durable writes in the module docstring's order, then the spawns: each write
        made for all of ``items`` at once."""
        prepared = self._prepare_all([request for request, _ in items])
        results: list[ProcessHandle | Exception] = []
        spawned: list[tuple[int, _Run, bool]] = []
        try:
            for (request, source), made in zip(items, prepared, strict=True):
                run: _Run | Exception = (
                    made
                    if isinstance(made, Exception)
                    else outcome_of(functools.partial(self._spawned, request, made, source))
                )
                if isinstance(run, Exception):
                    results.append(run)
                    continue
                spawned.append((len(results), run, request.background))
                results.append(ProcessHandle(run.handle, run.process_id))
        except BaseException:  # e.g. Ctrl-C: no child spawned so far may go on unowned
            for _, run, _ in spawned:
                self._abort(run)
            raise
        live = self._go_live_all([(run, background) for _, run, background in spawned])
        for (index, _, _), error in zip(spawned, live, strict=True):
            if error is not None:
                results[index] = error
        return results

    def _prepare(self, request: _StartRequest) -> _Prepared:
        return _raised(self._prepare_all([request])[0])

    def _prepare_all(self, requests: Sequence[_StartRequest]) -> list[_Prepared | Exception]:
        """Register, claim and stamp the first start of each: everything durable before the
        spawn (``starting``), for all of them in one write."""
        made = [outcome_of(functools.partial(self._registration, r)) for r in requests]
        claimed = _through(made, self._register_all)
        return [
            c if isinstance(c, Exception) else outcome_of(functools.partial(self._ticketed, r, *c))
            for r, c in zip(requests, claimed, strict=True)
        ]

    def _ticketed(
        self, request: _StartRequest, record: ProcessRecord, keeper: LeaseKeeper
    ) -> _Prepared:
        workdir = record.input.cwd
        assert workdir is not None, "a supervised command's registration names its directory"
        ids = event_ids(record.id, record.registration_hash)
        ticket = _Ticket(
            self._handle_for(record.id, ids, request.notify_to),
            record.id,
            ids,
            request.notify_to,
            record.registration_hash,
            self._capture_for(request, record.id),
        )
        return _Prepared(ticket, keeper, workdir)

    def _launch(self, request: _StartRequest, prepared: _Prepared, source: int | None) -> _Run:
        """Spawn a prepared process and hand it to its owner thread."""
        run = self._spawned(request, prepared, source)
        self._go_live(run, request.background)
        return run

    def _spawned(self, request: _StartRequest, prepared: _Prepared, source: int | None) -> _Run:
        ticket, keeper, workdir = prepared
        watch = None if request.ready is None else ReadinessWatch(request.ready, workdir)
        child = self._spawn(request, workdir, ticket, keeper, source, watch=watch)
        run = _Run(ticket, keeper, child)
        run.watch = watch
        return run

    def _registration(self, request: _StartRequest) -> ProcessRegistration:
        """The registration; its input names the absolute directory the child runs in.

        Only an environment the caller passed is stored, and only for ``rerunnable`` work
        (which needs it to run again elsewhere): never an implicit copy of ``os.environ``. A
        process started without ``env`` inherits the supervisor's; its ``env_ref`` is the hash
        of that environment and no values are stored (``load_env`` says ``NotFound``), so a
        rerun inherits its runner's environment (docs/design.md §6.2)."""
        registry = self._registry
        if request.env is None:
            env_ref = _inherited_env_ref()
        elif request.disposition is RecoveryDisposition.rerunnable:
            env_ref = registry.store_env({str(k): str(v) for k, v in request.env.items()})
        else:
            env_ref = env_ref_for({str(k): str(v) for k, v in request.env.items()})
        cwd = request.cwd
        workdir = os.path.abspath(os.fspath(cwd) if cwd is not None else os.getcwd())
        scope = (
            None if request.session_id is None else SessionScope(session_id=str(request.session_id))
        )
        return ProcessRegistration(
            id=request.process_id or handle_table.new_process_id(registry.now_ms()),
            input=ProcessInput.command(request.args, workdir),
            disposition=request.disposition,
            originator=Originator.host(),
            wake_target=scope,
            env_ref=env_ref,
            readiness=request.ready,
            restart=request.restart,
            attempt_of=request.attempt_of,
            attempt=request.attempt,
        )

    def _capture_for(self, request: _StartRequest, pid: str) -> Capture | None:
        """The run's capture (None without one)."""
        if not request.capture:
            return None
        return open_capture(
            self._registry, self._output_dir, pid, request.output_limit, request.stdout
        )

    def _handle_for(self, pid: str, ids: EventIds, notify_to: _NotifyTo | None) -> str:
        """A new handle; persisted (and reused by a retried start) only where a completion
        notification is to be published, since ``restore`` must then publish it the same."""
        if notify_to is None:
            return handle_table.new_handle()
        registry = self._registry
        existing = handle_table.handle_for_process(registry, pid)
        handle = existing.handle if existing is not None else handle_table.new_handle()
        row = handle_table.HandleRow(
            handle, pid, self._owner.owner_id, notify_to[0], notify_to[1], ids.command_id
        )
        handle_table.save_handle(registry, row)
        return handle

    def _register_all(
        self, registrations: Sequence[ProcessRegistration]
    ) -> list[tuple[ProcessRecord, LeaseKeeper] | Exception]:
        """Register, claim and stamp this supervisor as first starter: one write for new
        processes; a retried start (the id known already) is checked and claimed step by
        step."""
        registry, since = self._registry, time.monotonic()
        claimed = registry.register_claimed_all(registrations, self._owner, self._timings.ttl_ms)
        return [
            c if isinstance(c, Exception) else outcome_of(functools.partial(self._kept, *c, since))
            for c in claimed
        ]

    def _kept(
        self, record: ProcessRecord, lease: Lease | None, since: float
    ) -> tuple[ProcessRecord, LeaseKeeper]:
        registry = self._registry
        if lease is not None:
            return record, LeaseKeeper(registry, lease, self._timings, since=since, log=log)
        refusal = start_refusal(record)
        if refusal is not None:
            raise refusal
        keeper = self._claim(record.id)
        registry.record_first_started(record.id, self._owner, registry.now_ms())
        return record, keeper

    def _claim(self, pid: str) -> LeaseKeeper:
        """The lease for a first run (or a retried start whose holder is provably dead)."""
        registry, ttl, since = self._registry, self._timings.ttl_ms, time.monotonic()
        claimed = registry.claim_lease(pid, self._owner, ttl)
        if not isinstance(claimed, Acquired):
            claimed = registry.reclaim_lease(pid, self._owner, claimed.holder, ttl)
        if not isinstance(claimed, Acquired):
            holder = claimed.holder.owner
            raise LeaseLost(
                f"process {pid!r} is held by owner {holder.owner_id!r} "
                f"(incarnation {holder.incarnation_id}): not started again"
            )
        return LeaseKeeper(registry, claimed.lease, self._timings, since=since, log=log)

    def _spawn(
        self,
        request: _StartRequest,
        workdir: str,
        ticket: _Ticket,
        keeper: LeaseKeeper,
        source: int | None,
        *,
        watch: ReadinessWatch | None = None,
    ) -> OwnedChild:
        """The child; if it cannot start, ``failed`` is recorded (and notified) first."""
        stdout, stderr = (
            ticket.capture.sinks() if ticket.capture is not None else (request.stdout, None)
        )
        env = request.env
        if watch is not None:
            if stdout is not None and stderr is not None:
                stdout, stderr = watch.sink(0, stdout), watch.sink(1, stderr)
            env = watch.child_env(dict(os.environ if env is None else env))
        try:
            return OwnedChild.spawn(
                request.args,
                cwd=workdir,
                env=env,
                stdin=request.stdin if isinstance(request.stdin, bytes) else None,
                stdout=stdout,
                stderr=stderr,
                stop=self._stop_policy,
                stdin_source=source,
                marker=ticket.ids.run_marker,
            )
        except SpawnError as error:
            if watch is not None:
                watch.close()
            result = spawn_failure(str(error))
            record = self._record_terminal(ticket, keeper, result)
            if record is not None:
                self._publish(ticket.ids.command_id, ticket.handle, ticket.notify_to, record)
            raise

    def _go_live(self, run: _Run, background: bool) -> None:
        error = self._go_live_all([(run, background)])[0]
        if error is not None:
            raise error

    def _go_live_all(self, runs: Sequence[tuple[_Run, bool]]) -> list[Exception | None]:
        """Record each child running (one write for all) and hand it to its owner. A child
        whose write failed is killed at once and its terminal recorded (if the store lets
        it); its error is returned."""
        registry, now = self._registry, self._registry.now_ms()
        writes = [
            registry.running_write(
                run.process_id,
                now,
                background=background,
                event_id=run.ids.backgrounded if background else run.ids.started,
                os=_os_facts(run.child.pid, run.child.pgid),
            )
            for run, background in runs
        ]
        try:
            records = registry.write_all(writes)
        except BaseException:
            for run, _ in runs:
                self._abort(run)
            raise
        errors: list[Exception | None] = []
        for (run, _), record in zip(runs, records, strict=True):
            if isinstance(record, Exception):
                self._abort(run)
                errors.append(record)
                continue
            if not record.stop_requested:
                # Our own write moved the change number: the stop poll need not read it back
                # (it did, for every run). A request already on record is left for the poll.
                run.seen_change_seq = record.change_seq
            errors.append(outcome_of(functools.partial(self._admit, run)))
        return errors

    def _abort(self, run: _Run) -> None:
        """A child that must not run on: killed, then its terminal recorded."""
        run.child.stop(StopPolicy((_SIGKILL,), 0.0))
        self._own(run)

    def _admit(self, run: _Run) -> None:
        """Hand the running child to its owner: a kept owner thread (``owners.py``) or the
        ``watch``; start the ticker if none runs, and wake it only if this lease is due
        before the ticker's next wake-up (a wake-up per run cost a thread switch per run)."""
        with self._lock:
            self._runs[run.handle] = run
            self._active[run.handle] = run
            if self._ticker is None:
                self._ticker = threading.Thread(
                    target=self._tick, name="procledger-supervisor-ticker", daemon=True
                )
                self._ticker_until = math.inf
                self._ticker.start()
            if self._closed:  # shutdown began while this one was starting
                with run.lock:
                    run.shutdown = True
            wake = run.keeper.due_at < self._ticker_until
        if wake:
            self._wake.set()
        if run.watch is not None:  # whoever waits for the child, its probes are watched here
            self._helper(functools.partial(self._watch_ready, run, run.watch))
        if self._watch is None:
            self._owners.run(functools.partial(self._own, run), f"procledger-run-{run.process_id}")
            return
        try:
            self._watch(run.child, Settle(self, run))
        except BaseException:  # the watcher refused it: the child must not go unowned
            log.exception("process %r: its watcher failed; an owner thread waits", run.handle)
            run.thread = threading.Thread(target=self._own, args=(run,), daemon=True)
            run.thread.start()

    # -- readiness (docs/design.md §15) ------------------------------------------------------------

    def _watch_ready(self, run: _Run, watch: ReadinessWatch) -> None:
        """The run's probes, until they all held (the ``ready`` fact), the ready timeout
        passed (the tree is stopped; the owner thread records ``ready_timeout``) or it ended."""

        def on_ready(probes: list[str]) -> None:
            try:
                self._registry.record_ready(run.process_id, self._registry.now_ms(), probes=probes)
            except InvalidTransition:
                return  # it ended first: never ready
            except Exception as error:  # a store outage: the run goes on, unready on record
                log.warning("process %r: readiness not recorded: %s", run.process_id, error)
            with run.lock:
                run.ready, run.ready_at = True, time.monotonic()
            run.settled.set()
            if run.service is not None:
                run.service.wake.set()

        def on_timeout(missing: list[str]) -> None:
            limit = watch.spec.timeout_s
            with run.lock:
                if run.ended:
                    return
                run.ready_timeout = (
                    f"not ready within {limit:g} s: {', '.join(missing)} did not hold"
                )
            log.info("process %r: %s; stopping its tree", run.process_id, run.ready_timeout)
            policy = request_policy(TerminalReason.terminated, self._stop_policy)
            run.child.stop(policy, escalate=True)

        watch.watch(lambda: not run.ended, on_ready, on_timeout)

    def wait_ready(
        self, handle: ProcessHandle | str, timeout: float | None = None
    ) -> ProcessRecord:
        """The record once the process is ready (``ready_at_ms`` set) or has ended without
        becoming ready (then its terminal record, ``ready_at_ms`` null): a caller starting a
        service waits here instead of guessing with a sleep. A process started without
        readiness probes counts as ready once it runs.

        Raises:
            NotFound: ``handle`` was not started by this supervisor.
            TimeoutError: neither happened within ``timeout`` seconds.
        """
        service = self._service(handle)
        if service is not None:
            return self._service_ready(service, timeout)
        run = self._find(handle)
        if isinstance(run, _Ended) or run.watch is None:
            return self._registry.get(run.process_id)
        if not run.settled.wait(timeout):
            raise TimeoutError(f"process {run.process_id!r} not ready after {timeout} s")
        if run.ready:
            return self._registry.get(run.process_id)
        return self._terminal_record(run, None)

    # -- services: restarts (docs/design.md §15) --------------------------------------------------

    def _service(self, handle: ProcessHandle | str) -> Service | None:
        key = handle.handle if isinstance(handle, ProcessHandle) else handle
        with self._lock:
            return self._services.get(key) if isinstance(key, str) else None

    def _start_service(
        self, request: _StartRequest, policy: RestartPolicy, source: int | None
    ) -> ProcessHandle:
        """The first attempt, as any start; then the service thread that restarts it."""
        run = self._launch(request, self._prepare(request), source)
        service = Service(run.handle, run.process_id, policy, request)
        service.current, run.service = run, service
        with self._lock:
            self._services[service.handle] = service
        self._helper(functools.partial(self._serve, service), name="procledger-service")
        return ProcessHandle(run.handle, run.process_id)

    def _serve(self, service: Service) -> None:
        """The service thread: attempt after attempt until the policy, a stop or the budget
        says no more."""
        try:
            self._serve_attempts(service)
        except BaseException as error:  # a store failure: no further attempt starts
            service.error = error
            log.warning("service %r: no further attempt: %s", service.first_id, error)
        finally:
            service.done.set()
            service.wake.set()

    def _serve_attempts(self, service: Service) -> None:
        restarts: tuple[float, ...] = ()
        while True:
            run = service.current
            run.done.wait()
            if run.error is not None:
                raise run.error
            service.record = run.record or self._registry.get(run.process_id)
            ended_at = self._ended_at(service.record)
            service.wake.set()
            if run.record is None:  # the lease was lost: its new holder decides
                return
            plan = self._plan_after(service, run, service.record, restarts)
            if plan.action == "give_up":
                service.record = self._registry.record_crash_loop(
                    run.process_id, restarts=len(plan.restarts), window_s=service.policy.window_s
                )
                tried = len(service.attempts)
                self._say(
                    f"service {service.first_id!r} gave up after {tried} attempts (crash_loop)"
                )
                return
            if plan.action == "stop":
                return
            restarts = plan.restarts
            delay = backoff_delay(service.policy, plan.number, service.rng.random())
            if not self._restart(service, ended_at + delay):
                return

    def _ended_at(self, record: ProcessRecord) -> float:
        """When ``record`` ended on the monotonic clock: the backoff counts from the recorded
        end, so the writes and notifications after it do not lengthen it."""
        now = time.monotonic()
        if record.finished_at_ms is None:
            return now
        return now - max(0, self._registry.now_ms() - record.finished_at_ms) / 1000

    def _plan_after(
        self, service: Service, run: _Run, record: ProcessRecord, restarts: tuple[float, ...]
    ) -> RestartPlan:
        """What follows ``run``'s end: never a restart after a stop, a lost lease or a
        shutdown; healthy time counts from readiness when probed, else from the spawn."""
        with run.lock:
            stopped = bool(run.requested) or run.shutdown or run.lease_lost
            since = run.ready_at if run.watch is not None else run.spawned_at
        now = time.monotonic()
        return plan_restart(
            service.policy,
            failed=record.status is ProcessStatus.failed,
            stopped=stopped or service.cancelled.is_set() or bool(record.stop_requested),
            restarts=restarts,
            now=now,
            healthy_s=0.0 if since is None else now - since,
        )

    def _restart(self, service: Service, start_at: float) -> bool:
        """The next attempt: registered and leased now (``starting``), spawned at ``start_at``
        (monotonic) unless the service is stopped meanwhile. False: no attempt runs."""
        number = len(service.attempts) + 1
        request = dataclasses.replace(
            service.template,
            process_id=attempt_id(service.first_id, number),
            attempt_of=service.first_id,
            attempt=number,
        )
        prepared = self._prepare(request)
        service.attempts.append(prepared.ticket.process_id)
        ended = self._backoff(service, prepared, start_at - time.monotonic())
        if ended is BackoffEnd.lost:
            return False
        if ended is BackoffEnd.go:
            with contextlib.suppress(SupervisorClosed), self._start_slot(), service.lock:
                if not service.cancelled.is_set():
                    with _stdin_source(request.stdin) as source:
                        run = self._launch(request, prepared, source)
                    run.service, service.current = service, run
                    return True
        service.record = self._cancel_pending(prepared, shutdown=self._closed)
        return False

    def _backoff(self, service: Service, prepared: _Prepared, delay_s: float) -> BackoffEnd:
        """Wait out the backoff, keeping the pending attempt's lease and watching for stops."""
        keeper, pid = prepared.keeper, prepared.ticket.process_id

        def stop_requested() -> bool:
            try:
                return bool(self._registry.get(pid).stop_requested)
            except Exception as error:  # a store outage: look again later
                log.info("process %r: reading its stop requests failed: %s", pid, error)
                return False

        def renew_due(now: float) -> float | None:
            if keeper.is_due(now) and keeper.renew(now) is Renewal.lost:
                return None
            return keeper.due_at

        return backoff_wait(
            delay_s, cancelled=service.cancelled, stop_requested=stop_requested, renew_due=renew_due
        )

    def _cancel_pending(self, prepared: _Prepared, *, shutdown: bool) -> ProcessRecord | None:
        """End an attempt that never ran: ``terminated`` (a stop; ``killed`` if one asked
        for it) or, during a shutdown, ``terminated``/``runner_shutdown``."""
        ticket, keeper = prepared.ticket, prepared.keeper
        if shutdown:
            result = Outcome(ProcessState.terminated, TerminalReason.runner_shutdown)
        else:
            requested = self._registry.get(ticket.process_id).stop_requested
            if not requested:
                reason = TerminalReason.terminated
                self._registry.request_stop(
                    ticket.process_id, reason, event_id=ticket.ids.stop[reason]
                )
            killed = TerminalReason.killed in requested
            state = ProcessState.killed if killed else ProcessState.terminated
            result = Outcome(state, TerminalReason(state.value))
        record = self._record_terminal(ticket, keeper, result)
        if record is not None:
            self._publish(ticket.ids.command_id, ticket.handle, ticket.notify_to, record)
        return record

    def _stop_service(
        self, service: Service, mode: StopMode, grace_s: float | None
    ) -> ProcessRecord:
        """Cancel further restarts, then stop the current attempt (if it still runs)."""
        with service.lock:
            service.cancelled.set()
            run = service.current
        record = self._stop_run(run, mode, grace_s)
        if mode is StopMode.interrupt and not record.is_terminal:
            return record
        service.done.wait()
        return service.record if service.record is not None else record

    def _service_ready(self, service: Service, timeout: float | None) -> ProcessRecord:
        """``wait_ready`` of a service: its newest attempt ready, or the service done."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            service.wake.clear()
            run = service.current
            with run.lock:
                ready = run.ready or (run.watch is None and not run.ended)
            if ready:
                return self._registry.get(run.process_id)
            if service.done.is_set():
                assert service.record is not None
                return service.record
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"service {service.first_id!r} not ready after {timeout} s")
            service.wake.wait(0.05 if remaining is None else min(remaining, 0.05))

    # -- the one completion path ------------------------------------------------------------------

    def _own(self, run: _Run) -> None:
        """The owner thread: wait for the child, record its one terminal, then notify."""
        self._own_all([run])

    def _own_all(self, runs: Sequence[_Run]) -> None:
        """The completion path of each run: its child's status (waited for if need be), its
        one terminal (one write for all), then its notification. What fails is kept on its
        own run (``wait`` raises it)."""
        try:
            self._finish_all([(run, *_child_status(run)) for run in runs])
        except BaseException as error:
            for run in runs:
                if run.record is None and run.error is None:
                    run.error = error
        finally:
            for run in runs:
                self._settled(run)

    def _settled(self, run: _Run) -> None:
        run.ticket = dataclasses.replace(run.ticket, capture=None)  # finished: its tails go
        with self._lock:
            self._active.pop(run.handle, None)
            self._retire(run)
            self._lock.notify_all()
        run.done.set()
        run.settled.set()

    def _retire(self, run: _Run) -> None:
        """Keep the newest ``FINISHED_KEPT`` finished runs whole and shrink older ones to an
        ``_Ended`` (under ``_lock``). A run whose terminal could not be written stays whole:
        its ``wait`` must go on raising why, which the ledger cannot tell."""
        if run.error is None:
            self._finished.append(run.handle)
        while len(self._finished) > FINISHED_KEPT:
            old = self._runs.pop(self._finished.popleft())
            self._ended[old.handle] = _Ended(old.process_id, old.returncode)

    def _finish_all(self, ended: Sequence[tuple[_Run, int, str | None]]) -> None:
        due: list[tuple[_Run, Outcome]] = []
        for run, returncode, failure in ended:
            result = outcome_of(functools.partial(self._outcome_of, run, returncode, failure))
            if isinstance(result, Exception):
                run.error = result
            elif result is not None:
                due.append((run, result))
        written = self._record_terminals([(run.ticket, run.keeper, result) for run, result in due])
        for (run, _), record in zip(due, written, strict=True):
            if isinstance(record, Exception):
                run.error = record
                continue
            run.record = record
            if record is not None:
                publish = functools.partial(
                    self._publish, run.ids.command_id, run.handle, run.notify_to, record
                )
                run.error = outcome_of(publish)

    def _outcome_of(self, run: _Run, returncode: int, failure: str | None) -> Outcome | None:
        """The run's terminal, from how its child ended and what was asked of it; ``None``
        if its lease was lost (the new holder records it)."""
        with run.lock:
            run.ended = True
            run.returncode = returncode
            requested, shutdown, lost = tuple(run.requested), run.shutdown, run.lease_lost
            ready_timeout = run.ready_timeout
        if lost:
            _output_of(run.ticket)  # closes the capture; the new holder records the terminal
            return None
        result = outcome(
            returncode,
            requested=requested,
            shutdown=shutdown,
            failure=failure,
            ready_timeout=ready_timeout,
        )
        return dataclasses.replace(result, survivors=tuple(run.child.survivors))

    def _record_terminal(
        self, ticket: _Ticket, keeper: LeaseKeeper, result: Outcome
    ) -> ProcessRecord | None:
        return _raised(self._record_terminals([(ticket, keeper, result)])[0])

    def _record_terminals(
        self, terminals: Sequence[tuple[_Ticket, LeaseKeeper, Outcome]]
    ) -> list[ProcessRecord | Exception | None]:
        """Put each outcome in the outbox, then record ``completed`` with the lease (released
        in the same write; one write for all), retried with its event id while the store
        fails -- for as long as this supervisor runs -- and delete each entry once the store
        decided (docs/design.md §6.3). ``None`` where another holder owns the process now
        (it records the terminal)."""
        saved = [outcome_of(functools.partial(self._saved, *terminal)) for terminal in terminals]
        decided = _through(saved, self._write_all_until_decided)
        for item, record in zip(saved, decided, strict=True):
            if isinstance(item, Exception):
                continue
            entry, _, outbox = item
            refused = isinstance(record, ProcledgerError)  # for good: nothing to deliver
            if outbox is not None and (refused or not isinstance(record, Exception)):
                outbox.remove(entry)
        return decided

    def _saved(
        self, ticket: _Ticket, keeper: LeaseKeeper, result: Outcome
    ) -> tuple[OutboxEntry, LeaseKeeper, Outbox | None]:
        entry = _entry(ticket, keeper.lease, result, self._store, _output_of(ticket))
        return entry, keeper, self._put(entry)

    def _write_all_until_decided(
        self, saved: Sequence[tuple[OutboxEntry, LeaseKeeper, Outbox | None]]
    ) -> list[ProcessRecord | Exception | None]:
        """``_write_until_decided`` of each, the first try of all in one write."""
        first: dict[int, ProcessRecord | Exception] = {}
        leased = [(i, e, k.lease) for i, (e, k, _) in enumerate(saved) if k.lease is not None]
        if len(saved) > 1 and leased:
            writes = [entry_write(self._registry, entry, lease) for _, entry, lease in leased]
            answers = self._registry.write_all(writes)
            first = dict(zip((i for i, _, _ in leased), answers, strict=True))
        return [
            answer
            if isinstance(answer := first.get(index), ProcessRecord)
            else outcome_of(functools.partial(self._write_until_decided, entry, keeper))
            for index, (entry, keeper, _) in enumerate(saved)
        ]

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
            except Exception as error:  # the store failed (also while taking the lease again)
                if not _transient(error):
                    raise
                if not waiting:
                    waiting = True
                    self._say(_waiting_line(entry, error))
                time.sleep(pause)  # backing off from a failing store; no event tells us it is back
                pause = min(pause * 2, RETRY_MAX_S)
                continue
            if waiting:
                self._say(f"recorded process {entry.process_id!r} in the store")
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

    def _outbox_for_store(self) -> Outbox | None:
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

    def _put(self, entry: OutboxEntry) -> Outbox | None:
        outbox = self._outbox_for_store() if entry.store else None
        if outbox is None:
            return None
        try:
            outbox.put(entry)
        except OSError as error:
            log.warning("process %r: outcome not saved in %r: %s", entry.process_id, outbox, error)
            return None
        return outbox

    def _say(self, line: str) -> None:
        log.info("%s", line)
        if self._notice is not None:
            self._notice(line)

    def _publish(
        self,
        command_id: uuid.UUID,
        handle: str,
        notify_to: tuple[uuid.UUID, uuid.UUID] | None,
        record: ProcessRecord,
    ) -> None:
        """Publish the completion notification (after the lease was released with the terminal).
        A refused delivery is the notifier's to report; the terminal stands either way."""
        notifier = self._notifier
        if notifier is None or notify_to is None or record.reason is None:
            return
        notification = ProcessCompletionNotification(
            command_id=command_id,
            session_id=notify_to[0],
            loop_id=notify_to[1],
            process_handle=handle,
            state=record.state,
            reason=record.reason,
        )
        try:
            delivery = notifier.notify_process_completion(notification)
        except ProcledgerError as error:
            log.warning("process %r: completion notification refused: %s", record.id, error)
            return
        if getattr(delivery, "error", None) is not None:
            log.info("process %r: completion notification %s", record.id, delivery)

    # -- wait and stop ---------------------------------------------------------------------------

    def wait(self, handle: ProcessHandle | str, timeout: float | None = None) -> ProcessRecord:
        """The process's record once its one terminal is recorded (and its lease released).

        Raises:
            NotFound: ``handle`` was not started by this supervisor.
            TimeoutError: the process still runs after ``timeout`` seconds.
            StoreError: the terminal could not be written (re-raised from the owner thread).

        For a service (``restart``) this waits until no attempt will start again and returns
        the newest attempt's record.
        """
        service = self._service(handle)
        if service is not None:
            if not service.done.wait(timeout):
                raise TimeoutError(f"service {service.first_id!r} still running after {timeout} s")
            if service.error is not None:
                raise service.error
            assert service.record is not None
            return service.record
        run = self._find(handle)
        if isinstance(run, _Ended):
            return self._registry.get(run.process_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        if not run.done.wait(timeout):
            raise TimeoutError(f"process {run.process_id!r} still running after {timeout} s")
        return self._terminal_record(run, deadline)

    def _terminal_record(self, run: _Run, deadline: float | None) -> ProcessRecord:
        run.done.wait()
        if run.thread is not None and run.thread is not threading.current_thread():
            run.thread.join()
        if run.error is not None:
            raise run.error
        if run.record is not None:
            return run.record
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        return self._registry.await_terminal(run.process_id, timeout=remaining)

    def returncode(self, handle: ProcessHandle | str) -> int | None:
        """The child's status as ``subprocess`` reports it (negative: the signal that ended
        it); ``None`` while it runs. The record keeps the terminal, not the signal number: the
        CLI needs it for its ``128 + signal`` exit code.

        Raises:
            NotFound: ``handle`` was not started by this supervisor.
        """
        service = self._service(handle)
        run = self._find(handle) if service is None else service.current
        if isinstance(run, _Ended):
            return run.returncode
        with run.lock:
            return run.returncode

    def stop(
        self, handle: ProcessHandle | str, mode: StopMode | str, grace_s: float | None = None
    ) -> ProcessRecord:
        """Stop the process's tree as ``mode`` says, recording the request first so that the
        terminal says why it ended; returns the record once the process ended (``interrupt``:
        once the grace passed, perhaps still running -- it never escalates).

        Stopping a process that has already ended signals nothing: its pid may be reused.

        Args:
            mode: ``interrupt``, ``terminate`` or ``kill`` (``StopMode``).
            grace_s: how long each signal is given; the supervisor's stop policy's if omitted.

        Raises:
            NotFound: ``handle`` was not started by this supervisor.
            ValueError: ``mode`` is not a stop mode.

        A service's stop stops its current attempt and cancels every further restart, also
        during a backoff wait (the attempt waiting to start ends ``terminated``).
        """
        service = self._service(handle)
        if service is not None:
            return self._stop_service(service, StopMode(mode), grace_s)
        run, stop_mode = self._find(handle), StopMode(mode)
        if isinstance(run, _Ended):  # long ended: nothing to signal (its pid may be reused)
            return self._registry.get(run.process_id)
        return self._stop_run(run, stop_mode, grace_s)

    def _stop_run(self, run: _Run, stop_mode: StopMode, grace_s: float | None) -> ProcessRecord:
        grace = self._stop_policy.grace_s if grace_s is None else grace_s
        policy, escalate = mode_policy(stop_mode, grace)
        if not self._request(run, stop_mode.reason):
            return self._terminal_record(run, None)
        exited = run.child.stop(policy, escalate=escalate)
        if exited and run.done.wait(grace if stop_mode is StopMode.interrupt else None):
            return self._terminal_record(run, None)
        return self._registry.get(run.process_id)

    def _request(self, run: _Run, reason: TerminalReason, *, durable: bool = False) -> bool:
        """Note a stop request (recording it unless ``durable`` already); False if the process
        has already ended, in which case nothing is recorded and nothing may be signalled."""
        with run.lock:
            if run.ended:
                return False
            run.claimed.add(reason)
        if not durable:
            try:
                self._registry.request_stop(run.process_id, reason, event_id=run.ids.stop[reason])
            except InvalidTransition:  # its terminal was recorded meanwhile
                return False
        with run.lock:
            if run.ended:
                return False
            if reason not in run.requested:
                run.requested.append(reason)
        return True

    def request_stop(self, handle: ProcessHandle | str, reason: TerminalReason | str) -> None:
        """Record a stop request and carry it out with this supervisor's stop policy in the
        background, as for a request made elsewhere; returns at once, so a signal handler (the
        CLI's Ctrl-C) never blocks on a grace period.

        Raises:
            NotFound: ``handle`` was not started by this supervisor.
            ValueError: ``reason`` is not ``interrupted``, ``terminated`` or ``killed``.
        """
        service = self._service(handle)
        if service is not None:
            with service.lock:
                service.cancelled.set()
                handle = service.current.handle
        run = self._find(handle)
        stop_reason = TerminalReason(reason)
        if stop_reason not in STOP_REASONS:
            raise ValueError(
                f"a stop is requested as interrupted, terminated or killed, not {reason!r}"
            )
        if isinstance(run, _Run):  # one long ended has nothing to stop
            self._helper(lambda: self._carry_out(run, stop_reason, durable=False))

    def _carry_out(self, run: _Run, reason: TerminalReason, *, durable: bool) -> None:
        if self._request(run, reason, durable=durable):
            run.child.stop(request_policy(reason, self._stop_policy), escalate=True)

    def _helper(self, target: Callable[[], object], name: str = "procledger-stopper") -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        with self._lock:
            self._helpers = [t for t in self._helpers if t.is_alive()]
            self._helpers.append(thread)
        thread.start()

    def _find(self, handle: ProcessHandle | str) -> _Run | _Ended:
        key = handle.handle if isinstance(handle, ProcessHandle) else handle
        with self._lock:
            run = (self._runs.get(key) or self._ended.get(key)) if isinstance(key, str) else None
        if run is None:
            raise NotFound(f"process handle {key!r} not found in this supervisor")
        return run

    # -- the ticker: leases and stop requests made elsewhere ------------------------------------

    def _tick(self) -> None:
        """Renew each run's lease when due, and poll for stop requests made elsewhere; until
        no run is active and none is starting."""
        next_poll = time.monotonic() + STOP_POLL_S
        while (runs := self._ticking()) is not None:
            now = time.monotonic()
            for run in runs:
                self._renew_if_due(run, now)
            if now >= next_poll:
                self._poll_stop_requests(runs)
                next_poll = now + STOP_POLL_S
            self._wake.wait(self._ticker_sleep(runs, next_poll))
            self._wake.clear()

    def _ticker_sleep(self, runs: list[_Run], next_poll: float) -> float:
        """How long the ticker sleeps now; a run admitted meanwhile wakes it only if its
        lease is due sooner (``_admit``)."""
        now = time.monotonic()
        sleep_s = _ticker_sleep_s(runs, next_poll, now)
        with self._lock:
            self._ticker_until = now + sleep_s
        return sleep_s

    def _ticking(self) -> list[_Run] | None:
        """The active runs; ``None`` (and the ticker retired) once there is nothing to keep."""
        with self._lock:
            runs = list(self._active.values())
            if not runs and not self._starting:
                self._ticker = None
                return None
            self._ticker_until = math.inf  # awake: a run admitted from now on wakes it
            return runs

    def _renew_if_due(self, run: _Run, now: float) -> None:
        if not (run.renewing and run.keeper.is_due(now)):
            return
        if run.keeper.renew(now) is Renewal.lost:
            self._lease_lost(run)

    def _lease_lost(self, run: _Run) -> None:
        """Another holder owns the process now: kill the tree, and leave its terminal to them."""
        with run.lock:
            if run.ended:
                return
            run.lease_lost = True
        log.warning("process %r: lease lost; killing its tree", run.process_id)
        self._helper(functools.partial(run.child.stop, StopPolicy((_SIGKILL,), 0.0)))

    def _poll_stop_requests(self, runs: list[_Run]) -> None:
        try:
            seqs = handle_table.change_seqs(self._registry, [r.process_id for r in runs])
        except Exception as error:
            log.info("polling stop requests failed: %s", error)  # a store outage: not news
            return
        for run in runs:
            seq = seqs.get(run.process_id, 0)
            if seq > run.seen_change_seq and not run.ended:
                self._take_stop_requests(run, seq)

    def _take_stop_requests(self, run: _Run, seq: int) -> None:
        """Carry out, in the background, each stop request on record not yet acted on here."""
        try:
            requested = self._registry.get(run.process_id).stop_requested
        except Exception as error:
            log.info("process %r: reading its stop requests failed: %s", run.process_id, error)
            return
        run.seen_change_seq = seq
        for reason in requested:
            with run.lock:
                new = reason not in run.claimed
                run.claimed.add(reason)
            if new:
                self._helper(functools.partial(self._carry_out, run, reason, durable=True))

    # -- restore and shutdown ----------------------------------------------------------------------

    def restore(self, *, keep_orphans: bool = False) -> list[ProcessRecord]:
        """Account for this owner's processes left behind by a supervisor that is gone.

        First the outbox is delivered (``deliver_outbox``): an outcome the gone supervisor knew
        but could not record is recorded as it was, with its exit code. Then each non-terminal
        process this owner started whose holder is gone (lease released, expired, or held by a
        provably dead holder) is taken over:

        - its recorded child still runs (same OS pid and start time on this host; a zombie
          counts as dead): its tree is stopped -- SIGTERM, SIGKILL after the stop policy's
          grace -- and it is recorded ``lost`` (its exit status cannot be known: it is not our
          child) with a diagnostic naming the pid, the signals sent, the one that ended it and
          any survivors; with ``keep_orphans`` it is left running and the diagnostic says so;
        - otherwise it is recorded ``lost``, and nothing is signalled.

        Each one's completion notification is published again with the same command id, so a
        receiver that already had it can tell. Processes whose holder is alive are left alone.

        Returns:
            The records written: delivered outcomes first, then the rest in process-id order.

        Raises:
            StoreError: the store failed; what was written so far stands.
        """
        written = self._deliver()
        with self._lock:
            mine = {run.process_id for run in self._active.values()}
        for record in _nonterminal(self._registry):
            if _restorable(record, self._owner.owner_id, mine):
                restored = self._restore_one(record, keep_orphans)
                if restored is not None:
                    written.append(restored)
        return written

    def _deliver(self) -> list[ProcessRecord]:
        """Deliver this store's outbox entries left by gone supervisors, and notify."""
        outbox = self._outbox_for_store()
        if outbox is None:
            return []
        delivered = deliver_outbox(self._registry, outbox, ttl_ms=self._timings.ttl_ms)
        for record in delivered:
            self._publish_again(record)
        return delivered

    def _restore_one(self, record: ProcessRecord, keep_orphans: bool) -> ProcessRecord | None:
        """Take one process over and record it; ``None`` if someone else holds or took it."""
        lease = self._take_over(record.id)
        if lease is None:
            return None  # its holder is alive (or not provably dead): leave it alone
        holder = record.first_started.owner if record.first_started else self._owner
        try:
            written = self._record_restored(record, lease, holder, keep_orphans)
        except (LeaseLost, InvalidTransition):
            return None  # another restorer or the holder itself got there first
        self._publish_again(written)
        return written

    def _record_restored(
        self, record: ProcessRecord, lease: Lease, holder: LeaseOwner, keep_orphans: bool
    ) -> ProcessRecord:
        child = orphans.find_live_child(record)
        grace = self._stop_policy.grace_s
        unrecorded = orphans.stop_unrecorded(record, grace, "restore", keep=keep_orphans)
        if unrecorded is not None:
            diagnostic = clip_diagnostic(f"{_gone_line(holder)}; {unrecorded}")
        elif child is None or keep_orphans:
            diagnostic = _restored_diagnostic(holder, child)
        else:
            stop = orphans.stop_tree(record, (_SIGTERM,), grace, escalate=True)
            done = orphans.describe_stop(record, stop, "restore")
            diagnostic = clip_diagnostic(f"{_gone_line(holder)}; {done}")
        output, tails = salvage(self._registry, record, self._output_dir)
        return self._registry.record_lost(
            record.id,
            diagnostic=diagnostic,
            event_id=event_ids(record.id, record.registration_hash).lost,
            lease=lease,
            output=output,
            tails=tails,
        )

    def _publish_again(self, written: ProcessRecord) -> None:
        """Publish a restored process's completion notification with its original handle and
        command id (only where ``start`` saved them)."""
        row = handle_table.handle_for_process(self._registry, written.id)
        if row is not None:
            notify_to = (
                None
                if row.session_id is None or row.loop_id is None
                else (row.session_id, row.loop_id)
            )
            self._publish(row.command_id, row.handle, notify_to, written)

    def _take_over(self, pid: str) -> Lease | None:
        """The lease of a process whose holder is gone, or ``None`` if its holder may live."""
        registry, ttl = self._registry, self._timings.ttl_ms
        try:
            current = registry.get_lease(pid)
            if current is None or not current.is_live(registry.now_ms()):
                taken = registry.claim_lease(pid, self._owner, ttl)
            else:
                taken = registry.reclaim_lease(pid, self._owner, current, ttl)
        except (InvalidTransition, NotFound):  # it ended, or was pruned, since we looked
            return None
        return taken.lease if isinstance(taken, Acquired) else None

    def shutdown(self, grace_s: float | None = None) -> None:
        """Admit no more processes and end every running tree, recording each terminal as
        ``runner_shutdown`` (and releasing its lease) so nothing is left for recovery.

        Every tree gets SIGTERM at once, then SIGKILL after ``grace_s`` (the stop policy's if
        omitted); returns once all terminals are recorded and every thread has ended.
        Idempotent; ``start`` raises ``SupervisorClosed`` from now on.
        """
        grace = self._stop_policy.grace_s if grace_s is None else grace_s
        runs = self._close()
        policy = StopPolicy((_SIGTERM,), grace)
        stoppers = [
            threading.Thread(target=run.child.stop, args=(policy,), daemon=True) for run in runs
        ]
        for thread in stoppers:
            thread.start()
        for thread in stoppers:
            thread.join()
        for run in runs:
            run.done.wait()
            if run.thread is not None:
                run.thread.join()
        self._join_threads()
        with self._lock:
            subreaper, self._subreaper = self._subreaper, False
        if subreaper:
            _Subreaper.release()

    def begin_shutdown(self) -> None:
        """The first half of ``shutdown``, for a caller that stops the trees itself (the event
        loop of ``procledger.aio``, which needs no thread per tree): admit no more processes,
        wait out the starts under way, and mark every running process as ended by the
        shutdown -- its terminal says ``runner_shutdown`` however it ends. Signals nothing;
        ``shutdown`` then stops what is still running and joins every thread."""
        self._close()

    def _close(self) -> list[_Run]:
        """Refuse new starts, wait out those under way, and mark every active run as ended by
        the shutdown; returns those runs."""
        with self._lock:
            self._closed = True
            for service in self._services.values():
                service.cancelled.set()
            while self._starting:
                self._lock.wait()
            runs = list(self._active.values())
        for run in runs:
            with run.lock:
                if not run.ended:
                    run.shutdown = True
        return runs

    def _join_threads(self) -> None:
        self._wake.set()
        with self._lock:
            ticker, helpers = self._ticker, list(self._helpers)
        if ticker is not None:
            ticker.join()
        for thread in helpers:
            thread.join()
        self._owners.close()


_SIGTERM: Final = signal.SIGTERM
_SIGKILL: Final = signal.SIGKILL


def _ticker_sleep_s(runs: list[_Run], next_poll: float, now: float) -> float:
    """How long the ticker may sleep at ``now``: until the next renewal or poll is due."""
    due = min((run.keeper.due_at for run in runs if run.renewing), default=next_poll)
    return max(0.0, min(next_poll, due) - now)


def _restorable(record: ProcessRecord, owner_id: str, mine: set[str]) -> bool:
    """Whether ``restore`` may take ``record`` on: first started by this owner, and not one
    of the runs this supervisor itself is keeping."""
    first = record.first_started
    return first is not None and first.owner.owner_id == owner_id and record.id not in mine


def _gone_line(holder: LeaseOwner) -> str:
    return f"supervisor {holder.owner_id!r} (incarnation {holder.incarnation_id}) is gone"


def _restored_diagnostic(holder: LeaseOwner, child: int | None) -> str:
    """Why a restored process is ``lost``: its child is gone, or was left running as asked."""
    if child is None:
        return clip_diagnostic(
            f"{_gone_line(holder)}; its child is no longer running: outcome unknown"
        )
    return clip_diagnostic(
        f"{_gone_line(holder)}; its child OS pid {child} is still running and was left "
        "running unsupervised (keep_orphans)"
    )


def _uuid_or_none(value: _SessionId | None) -> uuid.UUID | None:
    if value is None or isinstance(value, uuid.UUID):
        return value
    return uuid.UUID(value)


def _transient(error: Exception) -> bool:
    """A store failure worth retrying (not a decision the registry made)."""
    if isinstance(error, ProcledgerError):
        return isinstance(error, StoreError)
    return not isinstance(error, TypeError | ValueError)


def _nonterminal(registry: ProcessRegistry) -> list[ProcessRecord]:
    """Every non-terminal process (the ``running`` coarse status: starting or running), by id."""
    records: list[ProcessRecord] = registry.list_processes(ProcessListFilter(status="running"))
    return records


def _output_of(ticket: _Ticket) -> tuple[OutputSummary, dict[str, str]]:
    """The run's output facts for its terminal (closing its capture)."""
    if ticket.capture is None:
        return no_capture(this_host_id())
    return ticket.capture.finish()


T = TypeVar("T")


def _raised(result: T | Exception) -> T:
    """``result``, or raised if it is the error a step made of several ended in."""
    if isinstance(result, Exception):
        raise result
    return result


R = TypeVar("R")


def _through(
    items: Sequence[T | Exception], step: Callable[[list[T]], Sequence[R | Exception]]
) -> list[R | Exception]:
    """``step`` of the items that are not errors yet, each answer back in its item's place,
    each error kept in its own: how one step made for several starts or terminals at once
    leaves each its own outcome."""
    answers = iter(step([item for item in items if not isinstance(item, Exception)]))
    return [item if isinstance(item, Exception) else next(answers) for item in items]


def _child_status(run: _Run) -> tuple[int, str | None]:
    """How the run's child ended (waited for if need be), and the failure that ended it: a
    consumer or a read that failed (the tree is then stopped)."""
    try:
        return run.child.wait(), None
    except Exception as error:
        returncode = run.child.returncode if run.child.returncode is not None else -9
        return returncode, f"{type(error).__name__}: {error}"


_START: Final = inspect.signature(Supervisor.start)


def _opened(
    sources: contextlib.ExitStack, argv: Sequence[str], options: Mapping[str, Any]
) -> tuple[_StartRequest, int | None]:
    """``start``'s arguments checked as ``start`` checks them (an unknown option is the
    ``TypeError`` the call would raise), and the stdin source opened in ``sources``."""
    bound = _START.bind(None, argv, **options)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    del arguments["self"], arguments["argv"]
    request = _checked_request(argv, **arguments)
    return request, sources.enter_context(_stdin_source(request.stdin))


def _checked_request(argv: Sequence[str], **options: Any) -> _StartRequest:
    """``start``'s arguments checked and normalised, before anything is written."""
    capture, restart = bool(options["capture"]), options["restart"]
    if restart is not None and not isinstance(restart, RestartPolicy):
        raise TypeError(f"restart must be a procledger.RestartPolicy, not {restart!r}")
    return _StartRequest(
        args=checked_argv(argv),
        process_id=options["process_id"],
        cwd=options["cwd"],
        env=options["env"],
        stdin=_checked_stdin(options["stdin"]),
        stdout=options["stdout"],
        background=options["background"],
        disposition=RecoveryDisposition(options["disposition"]),
        session_id=_uuid_or_none(options["session_id"]),
        loop_id=_uuid_or_none(options["loop_id"]),
        capture=capture,
        output_limit=_checked_limit(options["output_limit"]),
        ready=_checked_ready(options["ready"], capture),
        restart=restart,
        attempt=None if restart is None else 1,
    )


def _checked_ready(ready: object, capture: bool) -> Readiness | None:
    """``start``'s ``ready``: a ``Readiness`` (an output probe needs the output captured)."""
    if ready is None:
        return None
    if not isinstance(ready, Readiness):
        raise TypeError(f"ready must be a procledger.Readiness, not {ready!r}")
    if ready.output is not None and not capture:
        raise ValueError("an output readiness probe needs the output captured (capture=True)")
    return ready


def _checked_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"output_limit must be an int (bytes), not {limit!r}")
    if not 0 <= limit <= MAX_LEDGER_INT:
        raise ValueError(f"output_limit must be from 0 to {MAX_LEDGER_INT} bytes, not {limit}")
    return limit


def _entry(
    ticket: _Ticket,
    lease: Lease,
    result: Outcome,
    store: str | None,
    output: tuple[OutputSummary, dict[str, str]],
) -> OutboxEntry:
    """The outbox entry of ``result`` (``store`` empty where there is no outbox)."""
    return OutboxEntry(
        store=store or "",
        host_id=this_host_id() or "",
        process_id=ticket.process_id,
        registration_hash=ticket.registration_hash,
        event_id=ticket.ids.completed,
        state=result.state.value,
        reason=result.reason.value,
        owner=lease.owner.model_dump(mode="json"),
        written_at_ms=int(time.time() * 1000),
        exit_code=result.exit_code,
        diagnostic=result.diagnostic,
        signal=result.signal,
        survivors=list(result.survivors),
        output=output[0].model_dump(mode="json"),
        tails=output[1],
    )


def _waiting_line(entry: OutboxEntry, error: Exception) -> str:
    ended = f"exit code {entry.exit_code}" if entry.exit_code is not None else entry.state
    return (
        f"process {entry.process_id!r} ended ({ended}); the store is unavailable, "
        f"retrying until it accepts the outcome (saved locally meanwhile): {error}"
    )


def _os_facts(pid: int, pgid: int) -> OsFacts | None:
    """The child as this host sees it now (unreaped, so its pid is still its own, even if it
    already exited); ``None`` where ``/proc`` cannot tell its start time or the host."""
    host, stat = this_host_id(), os_seam.proc_stat(pid)
    if host is None or stat is None:
        return None
    return OsFacts(pid=pid, pgid=pgid, start_time=stat[1], host_id=host)


def _inherited_env_ref() -> str:
    """The env ref of this process's environment (what a child started without ``env``
    inherits), hashed again only when the environment changed: decoding, sorting and hashing
    every variable cost ~50 µs of each start."""
    if not os.supports_bytes_environ:
        return env_ref_for(dict(os.environ))
    return _env_ref_of(tuple(os.environb.items()))


@functools.lru_cache(maxsize=1)
def _env_ref_of(environment: tuple[tuple[bytes, bytes], ...]) -> str:
    """The env ref of an environment given as bytes pairs (decoded as ``os.environ`` does).

    A shell can export any bytes, and text that is not UTF-8 cannot be canonical JSON: such an
    environment is hashed as its sorted ``NAME=value`` bytes instead (NUL-separated; neither
    holds a NUL). Its values are never stored, so the ref only has to tell it apart."""
    try:
        return env_ref_for({os.fsdecode(name): os.fsdecode(value) for name, value in environment})
    except TypeError:  # orjson refuses the surrogate escape of a byte that is not UTF-8
        lines = b"\0".join(sorted(name + b"=" + value for name, value in environment))
        return f"{ENV_REF_PREFIX}{hashlib.sha256(lines).hexdigest()}"


def _checked_stdin(stdin: object) -> Stdin:
    """``stdin`` if it is one of ``Stdin``'s forms; a plain string other than the two words
    is refused rather than guessed at (a path? data?)."""
    if stdin in ("inherit", "null") or isinstance(stdin, Path | bytes):
        return stdin
    if isinstance(stdin, int) and not isinstance(stdin, bool) and stdin >= 0:
        return stdin
    raise TypeError(
        f"stdin must be 'inherit', 'null', a pathlib.Path, bytes or a file descriptor, "
        f"not {stdin!r}"
    )


@contextmanager
def _stdin_source(stdin: Stdin) -> Iterator[int | None]:
    """What the child reads when no bytes are written to it, open for the start only (the
    child keeps its own copy of a file's descriptor)."""
    if isinstance(stdin, Path):
        fd = os.open(stdin, os.O_RDONLY)
        try:
            yield fd
        finally:
            os.close(fd)
    elif stdin == "inherit":
        yield None
    elif isinstance(stdin, int) and not isinstance(stdin, bool):
        yield stdin
    else:
        yield subprocess.DEVNULL


class _Subreaper:
    """This process's child-subreaper mark, counted over the supervisors that asked for it:
    set by the first, cleared by the last (unless it was set before any of them)."""

    _lock = threading.Lock()
    _count = 0
    _was_set = False

    @classmethod
    def acquire(cls) -> bool:
        with cls._lock:
            if cls._count == 0:
                cls._was_set = os_seam.is_child_subreaper()
                if not (cls._was_set or os_seam.set_child_subreaper(True)):
                    return False
            cls._count += 1
            return True

    @classmethod
    def release(cls) -> None:
        with cls._lock:
            cls._count -= 1
            if cls._count == 0 and not cls._was_set:
                os_seam.set_child_subreaper(False)
