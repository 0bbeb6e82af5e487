"""The Supervisor: real child processes as domain events (DESIGN.md §6.2).

Every process has exactly one **owner thread** from a successful spawn on: it waits for the
child (``OwnedChild.wait``), decides the terminal from how the child ended and what was asked of
it (``decide.outcome``), records it with the lease — which releases the lease in the same
transaction — and only then publishes the completion notification. ``stop``, ``shutdown``, a
lost lease and stop requests made elsewhere only *signal* the tree and note what they asked;
none of them writes a terminal, so exit, stop and shutdown can race freely and still produce
exactly one terminal, one lease release and one notification.

One **ticker thread** per supervisor (alive while it has running processes) renews leases
every ``renew_ms`` and, twice a second, notices ``stop_requested`` events written by others
(``registry.request_stop``, ``procledger stop``) and carries them out with the supervisor's own
stop policy.

Durable writes of a supervised process, in order: ``register`` (``starting`` is durable before
anything runs), ``claim_lease``, ``record_first_started``, the handle row (only when a completion
notification is to be published: ``restore`` must then publish the same one), then after the
spawn ``started`` or ``backgrounded``, and finally the terminal (``completed``, releasing the
lease in the same transaction). Each lifecycle write carries an id derived from the registration
(``decide.event_ids``), so retries never append twice.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, final

from procledger.domain.errors import (
    AlreadyTerminal,
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
from procledger.domain.records import ProcessRecord
from procledger.domain.registration import (
    Originator,
    ProcessInput,
    ProcessRegistration,
    SessionScope,
    env_ref_for,
)
from procledger.domain.vocabulary import ProcessState, RecoveryDisposition, TerminalReason
from procledger.projections.filters import ProcessListFilter
from procledger.registry import ProcessRegistry
from procledger.supervisor import handles as handle_table
from procledger.supervisor.decide import (
    EventIds,
    Outcome,
    event_ids,
    mode_policy,
    outcome,
    request_policy,
    spawn_failure,
)
from procledger.supervisor.execution import Consumer, Input, OwnedChild, StopPolicy
from procledger.supervisor.modes import StopMode

__all__ = ["ProcessHandle", "StopMode", "Supervisor"]

log = logging.getLogger("procledger.supervisor")

STOP_POLL_S: Final = 0.5
"""How often the ticker looks for stop requests made elsewhere (the contract says within 1 s)."""

RENEW_RETRY_S: Final = 1.0
"""How soon a lease renewal that failed on a store error is tried again."""

WRITE_RETRY_S: Final = 5.0
"""How long a terminal write is retried (with its stable id) when the store fails."""

_SessionId = uuid.UUID | str


class CompletionNotifier(Protocol):
    """What the Supervisor needs of a notifier (``procledger.notifications.Notifier``)."""

    def notify_process_completion(self, notification: ProcessCompletionNotification) -> Any: ...


@final
@dataclass(frozen=True, slots=True)
class ProcessHandle:
    """What ``start`` returns: the opaque ``handle`` (22 URL-safe characters that encode
    nothing) and the ``process_id`` in the ledger."""

    handle: str
    process_id: str


class _Run:
    """One supervised process from spawn to terminal; shared by its owner thread, the ticker
    and stoppers. ``lock`` guards the fields that decide the terminal."""

    def __init__(
        self,
        handle: str,
        process_id: str,
        *,
        ids: EventIds,
        lease: Lease,
        child: OwnedChild,
        notify_to: tuple[uuid.UUID, uuid.UUID] | None,
        renew_s: float,
    ) -> None:
        self.handle = handle
        self.process_id = process_id
        self.ids = ids
        self.lease = lease
        self.child = child
        self.notify_to = notify_to
        self.lock = threading.Lock()
        self.claimed: set[TerminalReason] = set()  # stop reasons someone here acts on
        self.requested: list[TerminalReason] = []  # durable stop requests, for the outcome
        self.shutdown = False
        self.ended = False  # the child's status is known: no more stops are taken
        self.returncode: int | None = None
        self.lease_lost = False
        self.renew_at = time.monotonic() + renew_s
        self.seen_change_seq = 0
        self.done = threading.Event()
        self.record: ProcessRecord | None = None
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None


class Supervisor:
    """Starts processes as this ``owner``, and turns what they do into lifecycle events.

    Thread-safe. Use it as a context manager (or call ``shutdown``) so no process outlives it.
    """

    def __init__(
        self,
        registry: ProcessRegistry,
        *,
        owner: LeaseOwner,
        notifier: CompletionNotifier | None = None,
        stop: StopPolicy = StopPolicy(),  # noqa: B008 -- an immutable value
        timings: LeaseTimings = LeaseTimings(),  # noqa: B008 -- an immutable value
    ) -> None:
        self._registry = registry
        self._owner = owner
        self._notifier = notifier
        self._stop_policy = stop
        self._timings = timings
        self._lock = threading.Condition()
        self._runs: dict[str, _Run] = {}
        self._active: dict[str, _Run] = {}
        self._starting = 0
        self._closed = False
        self._ticker: threading.Thread | None = None
        self._wake = threading.Event()
        self._helpers: list[threading.Thread] = []

    @property
    def owner(self) -> LeaseOwner:
        return self._owner

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    # -- start ---------------------------------------------------------------------------------

    def start(
        self,
        argv: Sequence[str],
        *,
        process_id: str | None = None,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        stdin: Input = None,
        stdout: Consumer | None = None,
        background: bool = False,
        disposition: RecoveryDisposition = RecoveryDisposition.owner_bound,
        session_id: _SessionId | None = None,
        loop_id: _SessionId | None = None,
    ) -> ProcessHandle:
        """Register, claim, spawn and record; see the module docstring for the order."""
        args = _argv(argv)
        with self._lock:
            if self._closed:
                raise SupervisorClosed(f"supervisor {self._owner.owner_id!r} is shut down")
            self._starting += 1
        try:
            return self._start(
                args,
                process_id=process_id,
                cwd=cwd,
                env=env,
                stdin=stdin,
                stdout=stdout,
                background=background,
                disposition=RecoveryDisposition(disposition),
                session_id=_uuid_or_none(session_id),
                loop_id=_uuid_or_none(loop_id),
            )
        finally:
            with self._lock:
                self._starting -= 1
                self._lock.notify_all()

    def _start(
        self,
        args: list[str],
        *,
        process_id: str | None,
        cwd: str | os.PathLike[str] | None,
        env: Mapping[str, str] | None,
        stdin: Input,
        stdout: Consumer | None,
        background: bool,
        disposition: RecoveryDisposition,
        session_id: uuid.UUID | None,
        loop_id: uuid.UUID | None,
    ) -> ProcessHandle:
        registry = self._registry
        values = {str(k): str(v) for k, v in (os.environ if env is None else env).items()}
        if disposition is RecoveryDisposition.rerunnable:
            env_ref = registry.store_env(values)  # needed to run it again elsewhere
        else:
            env_ref = env_ref_for(values)  # the hash only: the values are never stored
        workdir = os.path.abspath(os.fspath(cwd) if cwd is not None else os.getcwd())
        scope = None if session_id is None else SessionScope(session_id=str(session_id))
        registration = ProcessRegistration(
            id=process_id or self._new_process_id(),
            input=ProcessInput.command(args, workdir),
            disposition=disposition,
            originator=Originator.host(),
            wake_target=scope,
            env_ref=env_ref,
        )
        record = registry.register(registration)  # `starting` is durable before the spawn
        pid = record.id
        if record.state is not ProcessState.starting:  # a start already ran: never twice
            error = AlreadyTerminal if record.state.is_terminal else InvalidTransition
            raise error(record.state.value, "started", ProcessState.running.value, process_id=pid)
        ids = event_ids(pid, record.registration_hash)
        lease = self._claim(pid)
        registry.record_first_started(pid, self._owner, registry.now_ms())
        notify_to = None if session_id is None or loop_id is None else (session_id, loop_id)
        handle = self._handle_for(pid, ids, notify_to)
        try:
            child = OwnedChild.spawn(
                args, cwd=workdir, env=env, stdin=stdin, stdout=stdout, stop=self._stop_policy
            )
        except SpawnError as error:
            self._record_spawn_failure(
                pid, ids=ids, lease=lease, handle=handle, notify_to=notify_to, error=error
            )
            raise
        run = _Run(
            handle,
            pid,
            ids=ids,
            lease=lease,
            child=child,
            notify_to=notify_to,
            renew_s=self._timings.renew_ms / 1000,
        )
        try:
            self._record_running(run, background)
        except BaseException:
            child.stop(StopPolicy((_SIGKILL,), 0.0))
            self._own(run)  # records the terminal if the store lets it
            raise
        self._admit(run)
        return ProcessHandle(handle, pid)

    def _new_process_id(self) -> str:
        return f"{self._registry.now_ms():011x}-{uuid.uuid4().hex[:8]}"

    def _handle_for(
        self, pid: str, ids: EventIds, notify_to: tuple[uuid.UUID, uuid.UUID] | None
    ) -> str:
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

    def _claim(self, pid: str) -> Lease:
        """The lease for a first run (or a retried start whose holder is provably dead)."""
        registry, ttl = self._registry, self._timings.ttl_ms
        claimed = registry.claim_lease(pid, self._owner, ttl)
        if not isinstance(claimed, Acquired):
            claimed = registry.reclaim_lease(pid, self._owner, claimed.holder, ttl)
        if not isinstance(claimed, Acquired):
            holder = claimed.holder.owner
            raise LeaseLost(
                f"process {pid!r} is held by owner {holder.owner_id!r} "
                f"(incarnation {holder.incarnation_id}): not started again"
            )
        return claimed.lease

    def _record_running(self, run: _Run, background: bool) -> None:
        registry, now = self._registry, self._registry.now_ms()
        if background:
            registry.record_backgrounded(run.process_id, now, event_id=run.ids.backgrounded)
        else:
            registry.record_started(run.process_id, now, event_id=run.ids.started)

    def _record_spawn_failure(
        self,
        pid: str,
        *,
        ids: EventIds,
        lease: Lease,
        handle: str,
        notify_to: tuple[uuid.UUID, uuid.UUID] | None,
        error: SpawnError,
    ) -> None:
        result = spawn_failure(str(error))
        record = self._record_terminal(pid, ids, lease, result)
        if record is not None:
            self._publish(ids.command_id, handle, notify_to, record)

    def _admit(self, run: _Run) -> None:
        run.thread = threading.Thread(
            target=self._own, args=(run,), name=f"procledger-run-{run.process_id}", daemon=True
        )
        with self._lock:
            self._runs[run.handle] = run
            self._active[run.handle] = run
            if self._ticker is None:
                self._ticker = threading.Thread(
                    target=self._tick, name="procledger-supervisor-ticker", daemon=True
                )
                self._ticker.start()
            if self._closed:  # shutdown began while this one was starting
                with run.lock:
                    run.shutdown = True
        run.thread.start()

    # -- the one completion path ------------------------------------------------------------------

    def _own(self, run: _Run) -> None:
        """The owner thread: wait for the child, record its one terminal, then notify."""
        failure: str | None = None
        try:
            returncode = run.child.wait()
        except Exception as error:  # the consumer or a read failed; the tree is stopped
            returncode = run.child.returncode if run.child.returncode is not None else -9
            failure = f"{type(error).__name__}: {error}"
        try:
            self._finish(run, returncode, failure)
        except BaseException as error:
            run.error = error
        finally:
            with self._lock:
                self._active.pop(run.handle, None)
                self._lock.notify_all()
            run.done.set()
            self._wake.set()

    def _finish(self, run: _Run, returncode: int, failure: str | None) -> None:
        with run.lock:
            run.ended = True
            run.returncode = returncode
            requested, shutdown, lost = tuple(run.requested), run.shutdown, run.lease_lost
        if lost:
            return  # another holder owns the process now: it records the terminal
        result = outcome(returncode, requested=requested, shutdown=shutdown, failure=failure)
        run.record = self._record_terminal(run.process_id, run.ids, run.lease, result)
        if run.record is not None:
            self._publish(run.ids.command_id, run.handle, run.notify_to, run.record)

    def _record_terminal(
        self, pid: str, ids: EventIds, lease: Lease, result: Outcome
    ) -> ProcessRecord | None:
        """Record ``completed`` with the lease (released in the same write); retried with the
        same event id while the store fails. ``None`` if the lease was lost meanwhile."""
        deadline = time.monotonic() + WRITE_RETRY_S
        pause = 0.05
        while True:
            try:
                return self._registry.record_completed(
                    pid,
                    result.state,
                    result.reason,
                    exit_code=result.exit_code,
                    diagnostic=result.diagnostic,
                    event_id=ids.completed,
                    lease=lease,
                )
            except LeaseLost:
                log.warning("process %r: lease lost before its terminal was recorded", pid)
                return None
            except Exception as error:
                if not _transient(error) or time.monotonic() > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

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
        """Block until the process's terminal is recorded; ``TimeoutError`` on expiry."""
        run = self._find(handle)
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
        CLI needs it for its ``128 + signal`` exit code."""
        run = self._find(handle)
        with run.lock:
            return run.returncode

    def stop(
        self, handle: ProcessHandle | str, mode: StopMode | str, grace_s: float | None = None
    ) -> ProcessRecord:
        """Record the stop request, signal the tree as ``mode`` says, and return the record once
        the process ended (or, for ``interrupt``, once the grace passed)."""
        run = self._find(handle)
        stop_mode = StopMode(mode)
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
        """Record a stop request and carry it out with this supervisor's stop policy, in the
        background (as for a request made elsewhere); returns at once. The CLI's Ctrl-C."""
        run = self._find(handle)
        stop_reason = TerminalReason(reason)
        if stop_reason not in run.ids.stop:
            raise ValueError(
                f"a stop is requested as interrupted, terminated or killed, not {reason!r}"
            )
        self._helper(lambda: self._carry_out(run, stop_reason, durable=False))

    def _carry_out(self, run: _Run, reason: TerminalReason, *, durable: bool) -> None:
        if self._request(run, reason, durable=durable):
            run.child.stop(request_policy(reason, self._stop_policy), escalate=True)

    def _helper(self, target: Callable[[], object]) -> None:
        thread = threading.Thread(target=target, name="procledger-stopper", daemon=True)
        with self._lock:
            self._helpers = [t for t in self._helpers if t.is_alive()]
            self._helpers.append(thread)
        thread.start()

    def _find(self, handle: ProcessHandle | str) -> _Run:
        key = handle.handle if isinstance(handle, ProcessHandle) else handle
        with self._lock:
            run = self._runs.get(key) if isinstance(key, str) else None
        if run is None:
            raise NotFound(f"process handle {key!r} not found in this supervisor")
        return run

    # -- the ticker: leases and stop requests made elsewhere ------------------------------------

    def _tick(self) -> None:
        next_poll = time.monotonic() + STOP_POLL_S
        while True:
            with self._lock:
                runs = list(self._active.values())
                if not runs and not self._starting:
                    self._ticker = None
                    return
            now = time.monotonic()
            for run in runs:
                self._renew_if_due(run, now)
            if now >= next_poll:
                self._poll_stop_requests(runs)
                next_poll = now + STOP_POLL_S
            due = min((r.renew_at for r in runs), default=now)
            self._wake.wait(max(0.0, min(next_poll, due) - time.monotonic()))
            self._wake.clear()

    def _renew_if_due(self, run: _Run, now: float) -> None:
        if now < run.renew_at or run.ended or run.lease_lost:
            return
        renew_s = self._timings.renew_ms / 1000
        try:
            run.lease = self._registry.renew_lease(run.lease, self._timings.ttl_ms)
            run.renew_at = now + renew_s
        except LeaseLost:
            with run.lock:
                if run.ended:
                    return
                run.lease_lost = True
            log.warning("process %r: lease lost; killing its tree", run.process_id)
            self._helper(functools.partial(run.child.stop, StopPolicy((_SIGKILL,), 0.0)))
        except Exception as error:  # the store is unreachable: try again soon, not in a loop
            run.renew_at = now + min(renew_s, RENEW_RETRY_S)
            log.warning("process %r: lease renewal failed: %s", run.process_id, error)

    def _poll_stop_requests(self, runs: list[_Run]) -> None:
        try:
            seqs = handle_table.change_seqs(self._registry, [r.process_id for r in runs])
        except Exception as error:
            log.warning("polling stop requests failed: %s", error)
            return
        for run in runs:
            seq = seqs.get(run.process_id, 0)
            if seq <= run.seen_change_seq or run.ended:
                continue
            try:
                requested = self._registry.get(run.process_id).stop_requested
            except Exception as error:
                log.warning(
                    "process %r: reading its stop requests failed: %s", run.process_id, error
                )
                continue
            run.seen_change_seq = seq
            for reason in requested:
                with run.lock:
                    new = reason not in run.claimed
                    run.claimed.add(reason)
                if new:
                    self._helper(functools.partial(self._carry_out, run, reason, durable=True))

    # -- restore and shutdown ----------------------------------------------------------------------

    def restore(self) -> list[ProcessRecord]:
        """Record as ``lost`` every non-terminal process this owner started whose holder is gone
        (lease released, expired, or held by a provably dead holder); never signal its recorded
        pid; publish its completion notification again with the same command id. Returns the
        records written, in process-id order. Processes whose holder is alive are left alone."""
        lost: list[ProcessRecord] = []
        with self._lock:
            mine = {run.process_id for run in self._active.values()}
        for record in _nonterminal(self._registry):
            first = record.first_started
            if first is None or first.owner.owner_id != self._owner.owner_id:
                continue
            if record.id in mine:
                continue
            written = self._restore_one(record)
            if written is not None:
                lost.append(written)
        return lost

    def _restore_one(self, record: ProcessRecord) -> ProcessRecord | None:
        registry, ttl = self._registry, self._timings.ttl_ms
        current = registry.get_lease(record.id)
        if current is None or not current.is_live(registry.now_ms()):
            taken = registry.claim_lease(record.id, self._owner, ttl)
        else:
            taken = registry.reclaim_lease(record.id, self._owner, current, ttl)
        if not isinstance(taken, Acquired):
            return None  # its holder is alive (or not provably dead): leave it alone
        ids = event_ids(record.id, record.registration_hash)
        holder = record.first_started.owner if record.first_started else self._owner
        try:
            written = registry.record_lost(
                record.id,
                diagnostic=(
                    f"supervisor {holder.owner_id!r} (incarnation {holder.incarnation_id}) "
                    "is gone; restored without signalling the recorded process"
                ),
                event_id=ids.lost,
                lease=taken.lease,
            )
        except (LeaseLost, InvalidTransition):
            return None  # another restorer or the holder itself got there first
        row = handle_table.handle_for_process(registry, record.id)
        if row is not None:
            notify_to = (
                None
                if row.session_id is None or row.loop_id is None
                else (row.session_id, row.loop_id)
            )
            self._publish(row.command_id, row.handle, notify_to, written)
        return written

    def shutdown(self, grace_s: float | None = None) -> None:
        """Admit no more processes, terminate every running tree at once (SIGTERM, then SIGKILL
        after the grace), record their terminals as ``runner_shutdown``, release the leases."""
        grace = self._stop_policy.grace_s if grace_s is None else grace_s
        with self._lock:
            self._closed = True
            while self._starting:
                self._lock.wait()
            runs = list(self._active.values())
        for run in runs:
            with run.lock:
                if not run.ended:
                    run.shutdown = True
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

    def _join_threads(self) -> None:
        self._wake.set()
        with self._lock:
            ticker, helpers = self._ticker, list(self._helpers)
        if ticker is not None:
            ticker.join()
        for thread in helpers:
            thread.join()


_SIGTERM: Final = signal.SIGTERM
_SIGKILL: Final = signal.SIGKILL


def _argv(argv: Sequence[str]) -> list[str]:
    if isinstance(argv, str | bytes):
        raise TypeError(f"argv must be a list of strings, not a single string: {argv!r}")
    args = list(argv)
    if not args or not all(isinstance(a, str) for a in args) or not args[0]:
        raise TypeError(f"argv must be a non-empty list of strings, got {args!r}")
    return args


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
    return registry.list_processes(ProcessListFilter(status="running"))
