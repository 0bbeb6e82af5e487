"""Starting one supervised process (docs/design.md §6.2): the durable writes before the spawn,
the spawn, and the write that says it runs.

In order: ``register_claimed`` (the registration, the lease and ``first_started`` in one
transaction: ``starting`` is durable before anything runs), the handle row (only when a
completion notification is to be published: ``restore`` must then publish the same one), the
spawn, then ``started`` or ``backgrounded``. Each lifecycle write carries an id derived from the
registration (``decide.event_ids``), so a retried start never appends twice and never runs a
program twice. ``bursts.py`` makes the same writes for several starts at once.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

from procledger.application.handle_addresses import HandleRow
from procledger.application.lease_keeper import LeaseKeeper
from procledger.application.outbox import this_host_id
from procledger.domain.errors import LeaseLost, SpawnError
from procledger.domain.leases import Acquired, Lease, LeaseOwner, LeaseTimings
from procledger.domain.records import OsFacts, ProcessRecord
from procledger.domain.registration import (
    Originator,
    ProcessInput,
    ProcessRegistration,
    SessionScope,
    env_ref_for,
)
from procledger.domain.vocabulary import RecoveryDisposition
from procledger.supervisor import failpoints, os_seam
from procledger.supervisor.capture import open_capture
from procledger.supervisor.decide import EventIds, event_ids, spawn_failure, start_refusal
from procledger.supervisor.execution import OwnedChild, StopPolicy
from procledger.supervisor.file_capture import close_descriptors, open_file_capture
from procledger.supervisor.minting import new_handle, new_process_id
from procledger.supervisor.publishing import Publisher
from procledger.supervisor.requests import NotifyTo, StartRequest, inherited_env_ref
from procledger.supervisor.runs import Prepared, Run, Ticket
from procledger.supervisor.terminals import TerminalWriter
from procledger.supervisor.wiring import Kept, watch_for, wire

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry
    from procledger.application.unit_of_work import Write

__all__ = ["KILL_NOW", "Starter"]

log = logging.getLogger("procledger.supervisor")

KILL_NOW: Final = StopPolicy((signal.SIGKILL,), 0.0)
"""How a child that must not run on is stopped."""


class Starter:
    """Makes a start's writes and spawns its child; hands each running child to ``admit``
    and each child that must not run on -- killed -- to ``complete``."""

    def __init__(
        self,
        registry: ProcessRegistry,
        owner: LeaseOwner,
        *,
        timings: LeaseTimings,
        stop_policy: StopPolicy,
        output_dir: Path | None,
        terminals: tuple[TerminalWriter, Publisher],
        hands: tuple[Callable[[Run], None], Callable[[Run], None]],
        output_files: bool = False,
    ) -> None:
        """``output_files``: captured children write their own output files (no pipe), as a
        host agent's children must (docs/design.md §14.1)."""
        self._registry, self._owner, self._timings = registry, owner, timings
        self._stop_policy, self._output_dir = stop_policy, output_dir
        self._output_files = output_files
        self._writer, self._publisher = terminals
        self._admit, self._complete = hands

    @property
    def registry(self) -> ProcessRegistry:
        return self._registry

    @property
    def owner(self) -> LeaseOwner:
        return self._owner

    @property
    def ttl_ms(self) -> int:
        return self._timings.ttl_ms

    def launch(self, request: StartRequest, source: int | None) -> Run:
        """One whole start: ``prepare``, then ``spawn`` and ``go_live``."""
        return self.spawn_live(request, self.prepare(request), source)

    def spawn_live(self, request: StartRequest, prepared: Prepared, source: int | None) -> Run:
        """Spawn a prepared process and record it running."""
        run = self.spawn(request, prepared, source)
        self.go_live(run, request.background)
        return run

    def prepare(self, request: StartRequest) -> Prepared:
        """Register, claim and stamp: everything durable before the spawn (``starting``)."""
        since = time.monotonic()
        claimed = self._registry.register_claimed(
            self.registration(request), self._owner, self._timings.ttl_ms
        )
        return self.ticketed(request, self.kept(*claimed, since))

    def registration(self, request: StartRequest) -> ProcessRegistration:
        """The registration; its input names the absolute directory the child runs in.

        Only an environment the caller passed is stored, and only for ``rerunnable`` work
        (which needs it to run again elsewhere): never an implicit copy of ``os.environ``. A
        process started without ``env`` inherits the supervisor's; its ``env_ref`` is the hash
        of that environment and no values are stored (``load_env`` says ``NotFound``), so a
        rerun inherits its runner's environment (docs/design.md §6.2)."""
        registry = self._registry
        if request.env is None:
            env_ref = inherited_env_ref()
        elif request.disposition is RecoveryDisposition.rerunnable:
            env_ref = registry.store_env({str(k): str(v) for k, v in request.env.items()})
        else:
            env_ref = env_ref_for({str(k): str(v) for k, v in request.env.items()})
        session = request.session_id
        return ProcessRegistration(
            id=request.process_id or new_process_id(registry.now_ms()),
            input=ProcessInput.command(request.args, request.workdir),
            disposition=request.disposition,
            originator=Originator.host(),
            wake_target=None if session is None else SessionScope(session_id=str(session)),
            env_ref=env_ref,
            readiness=request.ready,
            restart=request.restart,
            attempt_of=request.attempt_of,
            attempt=request.attempt,
            name=request.name,
            digest=request.digest,
            port=None if request.port == "auto" else request.port,
            starts_at_ms=request.starts_at_ms,
            pty=True if request.pty is not None else None,
        )

    def kept(
        self, record: ProcessRecord, lease: Lease | None, since: float
    ) -> tuple[ProcessRecord, LeaseKeeper]:
        """The record and the keeper of its lease: the one just taken with the registration,
        or -- a retried start, the id known already -- checked and claimed step by step."""
        registry = self._registry
        if lease is not None:
            return record, LeaseKeeper(registry, lease, self._timings, since=since, log=log)
        refusal = start_refusal(record)
        if refusal is not None:
            raise refusal
        keeper = self._claim(record.id)
        registry.record_first_started(record.id, self._owner, registry.now_ms())
        return record, keeper

    def ticketed(
        self, request: StartRequest, claimed: tuple[ProcessRecord, LeaseKeeper]
    ) -> Prepared:
        """The prepared start: its handle (saved where a notification is due) and capture."""
        failpoints.reached("after_register")
        record, keeper = claimed
        workdir = record.input.cwd
        assert workdir is not None, "a supervised command's registration names its directory"
        ids = event_ids(record.id, record.registration_hash)
        ticket = Ticket(
            self._handle_for(record.id, ids, request.notify_to),
            record.id,
            ids,
            request.notify_to,
            record.registration_hash,
            self._capture_for(request, record.id),
        )
        return Prepared(ticket, keeper, workdir)

    def spawn(self, request: StartRequest, prepared: Prepared, source: int | None) -> Run:
        """The child, wired to its capture and probes; if it cannot start, ``failed`` is
        recorded (and notified) first."""
        ticket, keeper, workdir = prepared
        watch = watch_for(request.ready, workdir)
        wiring = wire(ticket.capture, watch, request.env, stdout=request.stdout)
        try:
            child = OwnedChild.spawn(
                request.args,
                cwd=workdir,
                env=wiring.env,
                stdin=request.stdin if isinstance(request.stdin, bytes) else None,
                stdout=wiring.stdout,
                stderr=wiring.stderr,
                stop=request.stop or self._stop_policy,
                stdin_source=source,
                marker=ticket.ids.run_marker,
                files=wiring.files,
                hold_zombie=self._output_files,
                pty=request.pty,
            )
        except SpawnError as error:
            if watch is not None:
                watch.close()
            record = self._writer.record(ticket, keeper, spawn_failure(str(error)))
            if record is not None:
                self._publisher.publish(
                    ticket.ids.command_id, ticket.handle, ticket.notify_to, record
                )
            raise
        finally:
            close_descriptors(wiring.files)
        failpoints.reached("after_spawn")
        return Run(prepared, child, watch)

    def running_write(self, run: Run, background: bool) -> Write:
        """The ``started`` (``backgrounded``) write of a spawned child, with its OS facts."""
        failpoints.reached("before_backgrounded")
        return self._registry.running_write(
            run.process_id,
            self._registry.now_ms(),
            background=background,
            event_id=run.ids.backgrounded if background else run.ids.started,
            os=_os_facts(run.child.pid, run.child.pgid),
        )

    def go_live(self, run: Run, background: bool) -> None:
        """Record the child running and hand it to its owner; a child whose write failed is
        killed at once and its terminal recorded (if the store lets it)."""
        try:
            record = self._registry.make(self.running_write(run, background))
        except BaseException:
            self.abort(run)
            raise
        self.live(run, record)

    def live(self, run: Run, record: ProcessRecord) -> None:
        """The child runs on record: its owner takes it."""
        if not record.stop_requested:
            # Our own write moved the change number: the stop poll need not read it back
            # (it did, for every run). A request already on record is left for the poll.
            run.seen_change_seq = record.change_seq
        self._admit(run)

    def abort(self, run: Run) -> None:
        """A child that must not run on: killed, then its terminal recorded."""
        run.child.stop(KILL_NOW)
        self._complete(run)

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

    def _capture_for(self, request: StartRequest, pid: str) -> Kept | None:
        if not request.capture:
            return None
        if self._output_files:
            return open_file_capture(self._registry, self._output_dir, pid, request.output_limit)
        return open_capture(
            self._registry, self._output_dir, pid, request.output_limit, request.stdout
        )

    def _handle_for(self, pid: str, ids: EventIds, notify_to: NotifyTo | None) -> str:
        """A new handle; persisted (and reused by a retried start) only where a completion
        notification is to be published, since ``restore`` must then publish it the same."""
        if notify_to is None:
            return new_handle()
        registry = self._registry
        existing = registry.handle_row(pid)
        handle = existing.handle if existing is not None else new_handle()
        row = HandleRow(
            handle, pid, self._owner.owner_id, notify_to[0], notify_to[1], ids.command_id
        )
        registry.save_handle_row(row)
        return handle


def _os_facts(pid: int, pgid: int) -> OsFacts | None:
    """The child as this host sees it now (unreaped, so its pid is still its own, even if it
    already exited); ``None`` where ``/proc`` cannot tell its start time or the host."""
    host, stat = this_host_id(), os_seam.proc_stat(pid)
    if host is None or stat is None:
        return None
    return OsFacts(pid=pid, pgid=pgid, start_time=stat[1], host_id=host)
