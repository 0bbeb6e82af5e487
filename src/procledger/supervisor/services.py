"""A supervised service: one command started again, as new attempts, by its restart policy
(docs/design.md §15).

Each attempt is its own process in the ledger -- its own id (``<first id>.<n>``), lifecycle and
lease -- linked to the first by ``attempt_of`` and numbered by ``attempt``; the closed table is
the same for every one. The ``Supervisor`` runs one **service thread** per service: it waits for
the current attempt's terminal, asks ``plan_restart`` what follows, and either stops, gives up
(the ``crash_loop`` fact on the last attempt) or registers the next attempt, holds its lease
through the backoff wait (``backoff_wait``) and spawns it. The next attempt is registered
*before* the wait, ``starting``, so a stop of the service during the wait -- this supervisor's
``stop``, or ``procledger stop`` from elsewhere, which finds the newest attempt -- has a process
to record it on: that attempt ends ``terminated`` without ever running.

A stop of the whole service is also a fact on record: ``service_stop_requested`` on its first
attempt (``registry.request_service_stop``), which ``procledger stop`` writes *before* it looks
for the attempt to stop. The thread reads it after each attempt ends, during the backoff, and
once more just before it spawns, under the service's lock: so no attempt starts after a stop
of the service was recorded, even one made while no attempt was running.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import random
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from enum import Enum
from typing import TYPE_CHECKING, Final

from procledger.application.lease_keeper import Renewal
from procledger.domain.attempts import attempt_id
from procledger.domain.errors import SupervisorClosed
from procledger.domain.records import ProcessRecord
from procledger.domain.service import RestartPlan, RestartPolicy, backoff_delay, plan_restart
from procledger.domain.vocabulary import ProcessState, ProcessStatus, TerminalReason
from procledger.supervisor.decide import Outcome
from procledger.supervisor.modes import StopMode
from procledger.supervisor.owners import HelperThreads
from procledger.supervisor.publishing import Publisher
from procledger.supervisor.requests import StartRequest, stdin_source
from procledger.supervisor.runs import Prepared, ProcessHandle, Run
from procledger.supervisor.starter import Starter
from procledger.supervisor.stopper import Stopper
from procledger.supervisor.terminals import TerminalWriter

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = ["BackoffEnd", "Service", "ServiceRunner", "backoff_wait"]

log = logging.getLogger("procledger.supervisor")

STOP_POLL_S: Final = 0.5
"""How often a backoff wait looks for a stop request recorded elsewhere."""


class Service:
    """What the supervisor knows of one service; ``lock`` orders a stop against a launch, so a
    stop never misses an attempt that was starting."""

    def __init__(self, first: Run, policy: RestartPolicy, template: StartRequest) -> None:
        self.handle, self.first_id = first.handle, template.attempt_of or first.process_id
        self.policy = policy
        self.template = template  # the first attempt's start request (or the resumed one's)
        self.current = first  # the run of the newest attempt
        self.attempts = [
            attempt_id(self.first_id, n) for n in range(1, (template.attempt or 1) + 1)
        ]
        self.lock = threading.Lock()
        self.cancelled = threading.Event()  # stopped, or the supervisor shuts down
        self.done = threading.Event()  # no attempt will start again
        self.wake = threading.Event()  # an attempt became ready or ended, or the service is done
        self.record: ProcessRecord | None = None  # the newest attempt's terminal record
        self.error: BaseException | None = None
        self.rng = random.Random()
        first.wakes = self.wake

    def follow(self, run: Run) -> None:
        """``run`` is the newest attempt now."""
        run.wakes, self.current = self.wake, run


class BackoffEnd(Enum):
    """How a backoff wait ended."""

    go = "go"  # the delay passed: start the attempt
    stop = "stop"  # the service was stopped (here or by a request on record)
    lost = "lost"  # the pending attempt's lease was lost: its new holder decides


def backoff_wait(
    delay_s: float,
    *,
    cancelled: threading.Event,
    stop_requested: Callable[[], bool],
    renew_due: Callable[[float], float | None],
) -> BackoffEnd:
    """Wait ``delay_s`` seconds unless ``cancelled`` is set or ``stop_requested()`` (asked
    every ``STOP_POLL_S``) says so; ``renew_due(now)`` keeps the pending attempt's lease and
    returns when it is next due, or ``None`` if the lease was lost."""
    start = time.monotonic()
    deadline, next_poll = start + delay_s, start
    while True:
        now = time.monotonic()
        if cancelled.is_set():
            return BackoffEnd.stop
        if now >= next_poll:
            if stop_requested():
                return BackoffEnd.stop
            next_poll = now + STOP_POLL_S
        due = renew_due(now)
        if due is None:
            return BackoffEnd.lost
        if now >= deadline:
            return BackoffEnd.go
        cancelled.wait(max(0.0, min(deadline, next_poll, due) - now))


class ServiceRunner:
    """This supervisor's services: the first attempt started as any start, then one service
    thread each that restarts it (see the module docstring)."""

    def __init__(
        self,
        registry: ProcessRegistry,
        parts: tuple[Starter, Stopper, TerminalWriter, Publisher],
        helpers: HelperThreads,
        slot: Callable[[], AbstractContextManager[None]],
        closed: Callable[[], bool],
    ) -> None:
        self._registry, self._helpers = registry, helpers
        self._starter, self._stopper, self._writer, self._publisher = parts
        self._slot, self._closed = slot, closed
        self._lock = threading.Lock()
        self._services: dict[str, Service] = {}

    def start(self, request: StartRequest, source: int | None) -> ProcessHandle:
        """The first attempt, as any start; then the service thread that restarts it."""
        assert request.restart is not None, "a service has a restart policy"
        run = self._starter.launch(request, source)
        service = Service(run, request.restart, request)
        with self._lock:
            self._services[service.handle] = service
        self._helpers.start(functools.partial(self._serve, service), name="procledger-service")
        return run.process_handle

    def find(self, handle: ProcessHandle | str) -> Service | None:
        key = handle.handle if isinstance(handle, ProcessHandle) else handle
        with self._lock:
            return self._services.get(key) if isinstance(key, str) else None

    def cancel_all(self) -> None:
        """No service starts another attempt (the supervisor shuts down)."""
        with self._lock:
            services = list(self._services.values())
        for service in services:
            service.cancelled.set()

    def cancel(self, service: Service) -> Run:
        """No further restarts; returns the current attempt's run (to stop, if it runs)."""
        with service.lock:
            service.cancelled.set()
            return service.current

    def stop(self, service: Service, mode: StopMode, grace_s: float | None) -> ProcessRecord:
        """Cancel further restarts, record the stop of the service (so readers elsewhere know
        no attempt follows), then stop the current attempt (if it still runs)."""
        current = self.cancel(service)
        try:
            self._registry.request_service_stop(service.first_id, mode.reason)
        except Exception as error:  # this runner is cancelled all the same
            log.warning("service %r: recording its stop failed: %s", service.first_id, error)
        record = self._stopper.stop(current, mode, grace_s)
        if mode is StopMode.interrupt and not record.is_terminal:
            return record
        service.done.wait()
        return service.record if service.record is not None else record

    def wait(self, service: Service, timeout: float | None) -> ProcessRecord:
        """Until no attempt will start again: the newest attempt's record."""
        if not service.done.wait(timeout):
            raise TimeoutError(f"service {service.first_id!r} still running after {timeout} s")
        if service.error is not None:
            raise service.error
        assert service.record is not None
        return service.record

    def ready(self, service: Service, timeout: float | None) -> ProcessRecord:
        """``wait_ready`` of a service: its newest attempt ready, or the service done."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            service.wake.clear()
            run = service.current
            if run.is_up():
                return self._registry.get(run.process_id)
            if service.done.is_set():
                assert service.record is not None
                return service.record
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"service {service.first_id!r} not ready after {timeout} s")
            service.wake.wait(0.05 if remaining is None else min(remaining, 0.05))

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
                self._give_up(service, run, plan)
                return
            if plan.action == "stop":
                return
            restarts = plan.restarts
            delay = backoff_delay(service.policy, plan.number, service.rng.random())
            if not self._restart(service, ended_at + delay):
                return

    def _give_up(self, service: Service, run: Run, plan: RestartPlan) -> None:
        """The ``crash_loop`` fact on the last attempt: no attempt starts again."""
        service.record = self._registry.record_crash_loop(
            run.process_id, restarts=len(plan.restarts), window_s=service.policy.window_s
        )
        tried = len(service.attempts)
        self._writer.say(
            f"service {service.first_id!r} gave up after {tried} attempts (crash_loop)"
        )

    def _ended_at(self, record: ProcessRecord) -> float:
        """When ``record`` ended on the monotonic clock: the backoff counts from the recorded
        end, so the writes and notifications after it do not lengthen it."""
        now = time.monotonic()
        if record.finished_at_ms is None:
            return now
        return now - max(0, self._registry.now_ms() - record.finished_at_ms) / 1000

    def _plan_after(
        self, service: Service, run: Run, record: ProcessRecord, restarts: tuple[float, ...]
    ) -> RestartPlan:
        """What follows ``run``'s end: never a restart after a stop (of the attempt or, on
        record, of the service), a lost lease or a shutdown; healthy time counts from readiness
        when probed, else from the spawn."""
        stopped = run.stopped() or service.cancelled.is_set() or bool(record.stop_requested)
        stopped = stopped or bool(self._stops_on_record(service))
        since, now = run.healthy_since(), time.monotonic()
        return plan_restart(
            service.policy,
            failed=record.status is ProcessStatus.failed,
            stopped=stopped,
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
            starts_at_ms=self._registry.now_ms()
            + round(max(0.0, start_at - time.monotonic()) * 1000),
        )
        prepared = self._starter.prepare(request)
        service.attempts.append(prepared.ticket.process_id)
        ended = self._backoff(service, prepared, start_at - time.monotonic())
        if ended is BackoffEnd.lost:
            return False
        if ended is BackoffEnd.go:
            with contextlib.suppress(SupervisorClosed), self._slot(), service.lock:
                if not service.cancelled.is_set() and not self._stops_on_record(service):
                    with stdin_source(request.stdin) as source:
                        service.follow(self._starter.spawn_live(request, prepared, source))
                    return True
        service.record = self._cancel_pending(service, prepared, shutdown=self._closed())
        return False

    def _stops_on_record(self, service: Service, pid: str | None = None) -> list[TerminalReason]:
        """The stops on record of the whole service (its first attempt's
        ``service_stop_requested``) and, given ``pid``, of that attempt; none when the store
        cannot say now (a backoff looks again; a spawn goes ahead and is stopped by the poll)."""
        try:
            reasons = list(self._registry.get(service.first_id).service_stop_requested)
            if pid is not None:
                reasons += self._registry.get(pid).stop_requested
        except Exception as error:  # a store outage: not news
            log.info("service %r: reading its stop requests failed: %s", service.first_id, error)
            return []
        return reasons

    def _backoff(self, service: Service, prepared: Prepared, delay_s: float) -> BackoffEnd:
        """Wait out the backoff, keeping the pending attempt's lease and watching for stops."""
        keeper, pid = prepared.keeper, prepared.ticket.process_id

        def stop_requested() -> bool:
            return bool(self._stops_on_record(service, pid))

        def renew_due(now: float) -> float | None:
            if keeper.is_due(now) and keeper.renew(now) is Renewal.lost:
                return None
            return keeper.due_at

        return backoff_wait(
            delay_s, cancelled=service.cancelled, stop_requested=stop_requested, renew_due=renew_due
        )

    def _cancel_pending(
        self, service: Service, prepared: Prepared, *, shutdown: bool
    ) -> ProcessRecord | None:
        """End an attempt that never ran: ``terminated`` (a stop; ``killed`` if one, of it or
        of the service, asked for it) or, during a shutdown, ``terminated``/``runner_shutdown``."""
        ticket, keeper = prepared.ticket, prepared.keeper
        if shutdown:
            result = Outcome(ProcessState.terminated, TerminalReason.runner_shutdown)
        else:
            requested = self._registry.get(ticket.process_id).stop_requested
            if not requested:
                killed = TerminalReason.killed in self._stops_on_record(service)
                reason = TerminalReason.killed if killed else TerminalReason.terminated
                self._registry.request_stop(
                    ticket.process_id, reason, event_id=ticket.ids.stop[reason]
                )
                requested = [reason]
            killed = TerminalReason.killed in requested
            state = ProcessState.killed if killed else ProcessState.terminated
            result = Outcome(state, TerminalReason(state.value))
        record = self._writer.record(ticket, keeper, result)
        if record is not None:
            self._publisher.publish(ticket.ids.command_id, ticket.handle, ticket.notify_to, record)
        return record
