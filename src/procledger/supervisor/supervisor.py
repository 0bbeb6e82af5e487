"""The Supervisor: real child processes as domain events (docs/design.md §6.2).

A façade over parts that each do one job, in one-way order (§1.3 draws who calls whom):
``requests`` checks a start's arguments; ``starter`` makes its durable writes and spawns its
child (``bursts`` does the same for several at once); a ``Run`` (``runs``) is one child's
state and transitions; ``completion`` is a run's one completion path, which ``terminals`` (the
one place a terminal is written, outbox included) and ``publishing`` (its notification) serve;
``stopper`` carries out stops, ``ticker`` keeps leases and notices stops made elsewhere,
``services`` restarts, ``restorer`` takes over what a gone supervisor left. The Supervisor keeps
the public methods and the table of runs.

Every process has exactly one owner from a successful spawn on, which records its one terminal
-- releasing the lease in the same transaction -- and only then publishes its notification;
``stop``, ``shutdown``, a lost lease and stop requests made elsewhere only signal the tree and
note what they asked, so they can race freely and still produce exactly one terminal.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from procledger.adapters.outbox import Outbox
from procledger.application.unit_of_work import outcome_of
from procledger.domain.errors import SupervisorClosed
from procledger.domain.leases import LeaseOwner, LeaseTimings
from procledger.domain.records import ProcessRecord
from procledger.domain.service import Readiness, RestartPolicy
from procledger.domain.vocabulary import RecoveryDisposition, TerminalReason
from procledger.supervisor.bursts import start_all
from procledger.supervisor.capture import DEFAULT_OUTPUT_LIMIT
from procledger.supervisor.completion import Completion, Settle, Watch, terminal_record
from procledger.supervisor.decide import STOP_REASONS
from procledger.supervisor.execution import Consumer, StopPolicy
from procledger.supervisor.input import deliver
from procledger.supervisor.modes import StopMode
from procledger.supervisor.naming import named_opened, prepared_names
from procledger.supervisor.owners import HelperThreads, OwnerThreads
from procledger.supervisor.publishing import CompletionNotifier, Publisher
from procledger.supervisor.ready import watch_ready
from procledger.supervisor.requests import (
    SessionIdLike,
    Stdin,
    checked_request,
    stdin_source,
)
from procledger.supervisor.restorer import Restorer
from procledger.supervisor.runs import Ended, ProcessHandle, Run, RunTable
from procledger.supervisor.services import ServiceRunner
from procledger.supervisor.starter import Starter
from procledger.supervisor.stopper import Stopper
from procledger.supervisor.subreaper import Subreaper
from procledger.supervisor.terminal import Terminal, TerminalSize
from procledger.supervisor.terminals import Notice, TerminalWriter
from procledger.supervisor.ticker import Ticker

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = [
    "CompletionNotifier",
    "Notice",
    "ProcessHandle",
    "Settle",
    "Stdin",
    "StopMode",
    "Supervisor",
    "Watch",
]

log = logging.getLogger("procledger.supervisor")


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
        output_files: bool = False,
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
            notice: told (on an owner thread) when an outcome starts waiting for the store
                and when it got through; the library prints nothing itself.
            subreaper: mark this process a child subreaper (Linux) while the supervisor
                lives, so orphaned descendants re-parent to it and a stop can reap them.
                Process-wide: for programs that own their children, like ``procledger run``.
            output_dir: where captured output goes (§14); ``<state dir>/output`` by default.
            watch: who waits for each child (``Watch``; ``procledger.aio`` passes its loop's).
            output_files: captured children write their own output files (no pipe to us, so
                they outlive us: the host agent's mode, §14.1); ``watch`` follows them.
        """
        self._registry, self._owner, self._stop_policy = registry, owner, stop
        self._watch, self._output_files = watch, output_files
        self._subreaper = subreaper and Subreaper.acquire()
        self._lock = threading.Condition()
        self._starting, self._closed = 0, False
        self._table = RunTable(self._lock)
        self._owners, self._helpers = OwnerThreads(), HelperThreads()
        writer = TerminalWriter(registry, owner, timings, outbox, notice)
        self._assemble(timings, output_dir, writer, Publisher(registry, notifier))

    def _assemble(
        self,
        timings: LeaseTimings,
        output_dir: Path | None,
        writer: TerminalWriter,
        publisher: Publisher,
    ) -> None:
        """The parts, each given only what its one job needs (docs/design.md §1.3)."""
        registry, owner, stop = self._registry, self._owner, self._stop_policy
        self._completion = Completion(writer, publisher, self._table)
        self._starter = Starter(
            registry,
            owner,
            timings=timings,
            stop_policy=stop,
            output_dir=output_dir,
            terminals=(writer, publisher),
            hands=(self._admit, self._completion.complete),
            output_files=self._output_files,
        )
        self._stopper = Stopper(registry, stop, self._helpers)
        self._ticker = Ticker(registry, self._stopper, self._lock, self._ticking)
        self._services = ServiceRunner(
            registry, (self._starter, self._stopper, writer, publisher), self._helpers,
            self._start_slot, lambda: self._closed,
        )  # fmt: skip
        self._restorer = Restorer(registry, owner, (timings, stop, output_dir), (writer, publisher))

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
        session_id: SessionIdLike | None = None,
        loop_id: SessionIdLike | None = None,
        capture: bool = True,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        ready: Readiness | None = None,
        restart: RestartPolicy | None = None,
        stop: StopPolicy | None = None,
        name: str | None = None,
        digest: str | None = None,
        port: int | Literal["auto"] | None = None,
        port_range: tuple[int, int] | None = None,
        attempt_of: str | None = None,
        pty: bool | TerminalSize = False,
    ) -> ProcessHandle:
        """Run ``argv`` as ``process_id`` (minted when omitted); returns once the child runs and
        that is recorded (``starting`` is durable first: a retry never runs a program twice).

        Args:
            stdin, stdout: what it reads (``/dev/null``); who gets its raw output (inherited).
            disposition, session_id, loop_id: what recovery may do if this supervisor dies
                (§3.6); where the completion notification goes (both ids, or none sent).
            capture, output_limit: keep the output (§14), this many bytes (0: none) at most;
            name, digest, port, port_range, attempt_of: §19 (``naming``; resuming a service).
            ready: readiness probes (§15.2); past ``timeout_s``: ``failed``/``ready_timeout``.
            restart: start it again as new attempts when it ends (§15); the handle names the
                service (``wait``/``stop`` act on its current attempt). ``stop``: its policy.
            pty: on a pseudo-terminal (§20; ``True``: 24x80); one output stream; ``send``.

        Raises:
            SupervisorClosed, TypeError, ValueError, OSError, NameTaken, PortTaken: none written.
            InvalidTransition, LeaseLost: ``process_id`` was started before, or is held.
            SpawnError: the program could not be started; ``failed`` is recorded first.
        """
        options = {key: value for key, value in locals().items() if key not in ("self", "argv")}
        request = prepared_names(checked_request(argv, **options), self._registry)
        with self._start_slot(), stdin_source(request.stdin) as source:
            if request.restart is not None:
                return self._services.start(request, source)
            return self._starter.launch(request, source).process_handle

    def start_all(
        self, starts: Sequence[tuple[Sequence[str], Mapping[str, Any]]]
    ) -> list[ProcessHandle | Exception]:
        """Several starts at once: each ``(argv, options)`` as ``start(argv, **options)``
        makes it, with its own outcome -- its handle, or the error ``start`` would have raised
        (nothing written for a bad argument). Their writes share transactions: the
        registrations one, the ``started``/``backgrounded`` facts another, the children
        spawned one after another in between; a burst of starts costs a fraction of one by
        one (docs/design.md §6.2). A start with a restart policy starts its service alone.

        Raises:
            SupervisorClosed: ``shutdown`` has begun (nothing was started).
        """
        with self._start_slot(), contextlib.ExitStack() as sources:
            opening = functools.partial(named_opened, _START, self._registry, sources)
            items = [outcome_of(functools.partial(opening, *start)) for start in starts]
            return start_all(self._starter, self._services.start, items)

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

    def _admit(self, run: Run) -> None:
        """Hand the running child to its owner: a kept owner thread or the ``watch``; the
        ticker keeps its lease from now on."""
        with self._lock:
            self._table.admit(run)
            wake = self._ticker.admitted(run)
            if self._closed:  # shutdown began while this one was starting
                run.mark_shutdown()
        if wake:
            self._ticker.wake()
        if run.watch is not None:  # whoever waits for the child, its probes are watched here
            probes = functools.partial(
                watch_ready, self._registry, run, run.watch, self._stop_policy
            )
            self._helpers.start(probes)
        complete = functools.partial(self._completion.complete, run)
        if self._watch is None:
            self._owners.run(complete, f"procledger-run-{run.process_id}")
            return
        try:
            self._watch(run.child, Settle(self._completion, run))
        except BaseException:  # the watcher refused it: the child must not go unowned
            log.exception("process %r: its watcher failed; an owner thread waits", run.handle)
            run.thread = threading.Thread(target=complete, daemon=True)
            run.thread.start()

    def _ticking(self) -> list[Run] | None:
        """(Under the lock.) What the ticker keeps: ``None`` once no run is active and none
        is starting."""
        runs = self._table.active()
        return None if not runs and not self._starting else runs

    # -- wait and stop ---------------------------------------------------------------------------

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
        service = self._services.find(handle)
        if service is not None:
            return self._services.ready(service, timeout)
        run = self._table.find(handle)
        if isinstance(run, Ended) or run.watch is None:
            return self._registry.get(run.process_id)
        if not run.settled.wait(timeout):
            raise TimeoutError(f"process {run.process_id!r} not ready after {timeout} s")
        if run.ready:
            return self._registry.get(run.process_id)
        return terminal_record(self._registry, run, None)

    def wait(self, handle: ProcessHandle | str, timeout: float | None = None) -> ProcessRecord:
        """The process's record once its one terminal is recorded (and its lease released).

        Raises:
            NotFound: ``handle`` was not started by this supervisor.
            TimeoutError: the process still runs after ``timeout`` seconds.
            StoreError: the terminal could not be written (re-raised from the owner thread).

        For a service (``restart``) this waits until no attempt will start again and returns
        the newest attempt's record.
        """
        service = self._services.find(handle)
        if service is not None:
            return self._services.wait(service, timeout)
        run = self._table.find(handle)
        if isinstance(run, Ended):
            return self._registry.get(run.process_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        if not run.done.wait(timeout):
            raise TimeoutError(f"process {run.process_id!r} still running after {timeout} s")
        return terminal_record(self._registry, run, deadline)

    def returncode(self, handle: ProcessHandle | str) -> int | None:
        """The child's status as ``subprocess`` reports it (negative: the signal that ended
        it; the CLI's ``128 + signal``); ``None`` while it runs. ``NotFound``: not started here.
        """
        service = self._services.find(handle)
        run = self._table.find(handle) if service is None else service.current
        return run.returncode if isinstance(run, Ended) else run.current_returncode()

    def send(self, handle: ProcessHandle | str, data: bytes | str, **options: Any) -> bool:
        """Write ``data`` (str: UTF-8) to a process started with ``pty``, journalled first
        (``supervisor.input.deliver``: ``command_id``, ``eof``, ``redact``, what it raises);
        ``False`` when that command id is on record already: nothing is written again."""
        raw = data.encode() if isinstance(data, str) else data
        return deliver(self._registry, *self._terminal_of(handle), raw, **options)

    def terminal(self, handle: ProcessHandle | str) -> Terminal | None:
        """The master of a running process's pseudo-terminal (to relay, resize), else None."""
        return self._terminal_of(handle)[1]

    def _terminal_of(self, handle: ProcessHandle | str) -> tuple[str, Terminal | None]:
        service = self._services.find(handle)
        run = self._table.find(handle) if service is None else service.current
        return run.process_id, None if isinstance(run, Ended) else run.child.terminal

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
        service = self._services.find(handle)
        if service is not None:
            return self._services.stop(service, StopMode(mode), grace_s)
        run, stop_mode = self._table.find(handle), StopMode(mode)
        if isinstance(run, Ended):  # long ended: nothing to signal (its pid may be reused)
            return self._registry.get(run.process_id)
        return self._stopper.stop(run, stop_mode, grace_s)

    def look_for_requests(self) -> None:
        """Carry out stop requests made elsewhere now, not at the next poll."""
        self._ticker.poll_now()

    def request_stop(self, handle: ProcessHandle | str, reason: TerminalReason | str) -> None:
        """Record a stop request and carry it out with this supervisor's stop policy in the
        background, as for a request made elsewhere; returns at once, so a signal handler (the
        CLI's Ctrl-C) never blocks on a grace period.

        Raises:
            NotFound: ``handle`` was not started by this supervisor.
            ValueError: ``reason`` is not ``interrupted``, ``terminated`` or ``killed``.
        """
        service = self._services.find(handle)
        run = self._table.find(handle if service is None else self._services.cancel(service).handle)
        stop_reason = TerminalReason(reason)
        if stop_reason not in STOP_REASONS:
            raise ValueError(
                f"a stop is requested as interrupted, terminated or killed, not {reason!r}"
            )
        if isinstance(run, Run):  # one long ended has nothing to stop
            self._stopper.request_soon(run, stop_reason)

    # -- restore and shutdown ----------------------------------------------------------------------

    def restore(self, *, keep_orphans: bool = False) -> list[ProcessRecord]:
        """Account for this owner's processes left behind by a supervisor that is gone
        (``Restorer.restore``, docs/design.md §6.2): the outbox delivered first, then each
        whose holder is gone recorded ``lost`` -- its child still running stopped first,
        unless ``keep_orphans`` -- and its notification published again. Returns the records
        written. Raises ``StoreError``: what was written so far stands.
        """
        with self._lock:
            mine = {run.process_id for run in self._table.active()}
        return self._restorer.restore(mine, keep_orphans=keep_orphans)

    def shutdown(self, grace_s: float | None = None) -> None:
        """Admit no more processes and end every running tree, recording each terminal as
        ``runner_shutdown`` (and releasing its lease) so nothing is left for recovery.

        Every tree gets SIGTERM at once, then SIGKILL after ``grace_s`` (the stop policy's if
        omitted); returns once all terminals are recorded and every thread has ended.
        Idempotent; ``start`` raises ``SupervisorClosed`` from now on.
        """
        runs = self._close()
        self._stopper.stop_all(runs, self._stop_policy.grace_s if grace_s is None else grace_s)
        for run in runs:
            run.done.wait()
            if run.thread is not None:
                run.thread.join()
        self._ticker.join()
        self._helpers.join()
        self._owners.close()
        with self._lock:
            subreaper, self._subreaper = self._subreaper, False
        if subreaper:
            Subreaper.release()

    def begin_shutdown(self) -> None:
        """The first half of ``shutdown``, for a caller that stops the trees itself (the event
        loop of ``procledger.aio``, which needs no thread per tree): admit no more processes,
        wait out the starts under way, and mark every running process as ended by the
        shutdown -- its terminal says ``runner_shutdown`` however it ends. Signals nothing;
        ``shutdown`` then stops what is still running and joins every thread."""
        self._close()

    def _close(self) -> list[Run]:
        """Refuse new starts, wait out those under way, and mark every active run as ended by
        the shutdown; returns those runs."""
        with self._lock:
            self._closed = True
            self._services.cancel_all()
            while self._starting:
                self._lock.wait()
            runs = self._table.active()
        for run in runs:
            run.mark_shutdown()
        return runs


_START: Final = inspect.signature(Supervisor.start)
