"""Stopping and abandoning a process that another program supervises (docs/design.md §8).

One home for the rules both the CLI (`stop`, `abandon`) and the web view (§16) follow, so they
cannot drift apart. A stop succeeds only when someone carries it out: a live owner holding the
lease, asked through the ledger; or, with the owner gone and the recorded child alive on this
host, this process, which stops the tree itself and records the outcome. Otherwise nothing is
recorded and ``NobodyToStop`` says to abandon it. Abandoning takes the lease from nobody (or a
provably dead holder) and records ``abandoned/abandon_requested``.

``stop_target`` is the whole of `procledger stop`: a service (named by any attempt's id) is
ended as a service -- its stop recorded on its first attempt before its newest attempt is
looked at, so its supervisor starts no attempt after it (§15.4) -- and a ``lost`` record whose
child still runs here (a kept orphan, §6.2) has that child stopped by its recorded identity.
``host_id`` names this host in owner ids (``adapters.proc_facts``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NoReturn

from procledger.adapters.proc_facts import host_id
from procledger.domain.errors import AlreadyTerminal, NotFound, ProcledgerError
from procledger.domain.vocabulary import ProcessState, TerminalReason

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry
    from procledger.domain.leases import Lease, LeaseOwner
    from procledger.domain.records import ProcessRecord
    from procledger.supervisor.modes import StopMode
    from procledger.supervisor.orphans import OrphanStop

# The lease models (pydantic) load on first use: the CLI imports this module at start-up.

ABANDON_LEASE_TTL_MS = 30_000
"""How long the lease taken to record an abandonment lasts: the write takes milliseconds."""


class NobodyToStop(ProcledgerError):
    """A stop found neither a live owner to ask nor a live child on this host to stop."""


class StillOwned(ProcledgerError):
    """An abandonment refused: a live owner holds the process, or its child is still alive."""


_SESSION_NAMESPACE = uuid.UUID("0b7c5d2e-8a41-4c3f-9e6a-2f1d7b9c4a10")


def owner_session(owner_id: str) -> tuple[uuid.UUID, uuid.UUID]:
    """The notification session and its one loop of ``owner_id`` (the CLI's,
    ``procledger-cli@<host>``): derived from the id alone, so every `procledger` on the host --
    and the host agent, which publishes its runs' completions there -- finds the same ones."""
    return (
        uuid.uuid5(_SESSION_NAMESPACE, f"session:{owner_id}"),
        uuid.uuid5(_SESSION_NAMESPACE, f"loop:{owner_id}"),
    )


def host_owner(role: str) -> LeaseOwner:
    """``<role>@<host id>`` as a fresh incarnation: who acts (``procledger-cli``,
    ``procledger-web``) in the leases and diagnostics it writes."""
    from procledger.domain.leases import LeaseOwner

    return LeaseOwner.local_process(f"{role}@{host_id()}")


def live_owner(registry: ProcessRegistry, process_id: str, me: LeaseOwner) -> Lease | None:
    """The lease of a live owner of the process: not expired and its holder not provably dead
    (docs/design.md §3.5); ``None`` when nobody is there to carry out a request."""
    lease = registry.get_lease(process_id)
    if lease is None or not lease.is_live(registry.now_ms()):
        return None
    return None if registry.probe.provably_dead(lease.owner, me) else lease


def stop_process(
    registry: ProcessRegistry, record: ProcessRecord, mode: StopMode, grace_s: float, me: LeaseOwner
) -> tuple[ProcessRecord, bool]:
    """Stop an unended process: ``(record, True)`` when its live owner was asked (the request
    is recorded, the owner carries it out with its own grace), ``(record, False)`` when this
    process stopped the orphaned tree itself (``grace_s`` before SIGKILL) and recorded how it
    ended. ``NobodyToStop`` (nothing recorded) when neither is possible; ``AlreadyTerminal``
    when it ended meanwhile."""
    if live_owner(registry, record.id, me) is not None:
        return registry.request_stop(record.id, mode.reason), True
    from procledger.supervisor.orphans import stop_orphan

    record = registry.get(record.id)  # its owner released the lease as it wrote its end?
    if record.is_terminal:
        raise AlreadyTerminal(record.state.value, "stop", "stop", process_id=record.id)
    _child_to_stop(record)
    return stop_orphan(registry, record, mode, grace_s), False


@dataclass(frozen=True, slots=True)
class Stopped:
    """What a stop did. ``record``: the process's record after it (a service's: its newest
    attempt's). ``how``: ``ended`` (it had ended already: nothing done), ``asked`` (its live
    owner carries the stop out), ``here`` (its owner gone, this process stopped the tree and
    recorded how it ended) or ``orphan`` (the child of a ``lost`` record was stopped, as
    ``orphan`` tells). ``service``: the first attempt's id when the stop of a whole service was
    recorded (no attempt starts after it)."""

    record: ProcessRecord
    how: Literal["ended", "asked", "here", "orphan"]
    service: str | None = None
    orphan: OrphanStop | None = None


def stop_target(
    registry: ProcessRegistry, process_id: str, mode: StopMode, grace_s: float, me: LeaseOwner
) -> Stopped:
    """``procledger stop``: the process ``process_id`` names (an exact id), or, for an attempt
    of a service, the whole service (see the module docstring). ``grace_s``: what a tree
    stopped here gets before SIGKILL.

    Raises:
        NobodyToStop: its newest attempt runs, with no live owner and no live child here
            (nothing recorded).
        NotFound: no such process.
    """
    record = registry.get(process_id)
    if record.attempt is not None:
        return _stop_service(registry, record, mode, grace_s, me)
    return _stop_one(registry, record, mode, grace_s, me)


def _stop_one(
    registry: ProcessRegistry, record: ProcessRecord, mode: StopMode, grace_s: float, me: LeaseOwner
) -> Stopped:
    """One process: a kept orphan's child, its live owner asked, or its tree stopped here."""
    if record.is_terminal:
        return _stop_kept(registry, record, mode, grace_s, me)
    try:
        stopped, asked = stop_process(registry, record, mode, grace_s, me)
    except AlreadyTerminal:  # it ended between the look and the request
        return Stopped(registry.get(record.id), "ended")
    return Stopped(stopped, "asked" if asked else "here")


def _stop_kept(
    registry: ProcessRegistry, record: ProcessRecord, mode: StopMode, grace_s: float, me: LeaseOwner
) -> Stopped:
    """An ended process: nothing to do, unless it is ``lost`` and its child still runs here."""
    if not orphan_running(record):
        return Stopped(record, "ended")
    from procledger.supervisor.orphans import stop_kept_orphan

    done = stop_kept_orphan(registry, record, mode, grace_s, by=me.owner_id)
    if done is None:
        return Stopped(record, "ended")
    return Stopped(registry.get(record.id), "orphan", orphan=done)


def _stop_service(
    registry: ProcessRegistry, record: ProcessRecord, mode: StopMode, grace_s: float, me: LeaseOwner
) -> Stopped:
    """A service: over already (nothing recorded), or its stop recorded on its first attempt
    *first* -- its supervisor reads it before it starts any attempt -- then the newest attempt
    looked up again and stopped if it runs."""
    from procledger.domain.attempts import first_attempt_id, restart_may_follow

    first_id = first_attempt_id(record)
    newest = registry.newest_attempt(record.id)
    first = _first_attempt(registry, first_id)
    if newest.is_terminal and not restart_may_follow(newest, first=first):
        return _stop_kept(registry, newest, mode, grace_s, me)
    if not newest.is_terminal and live_owner(registry, newest.id, me) is None:
        _child_to_stop(registry.get(newest.id))  # unless it ended (its lease released) meanwhile
    if first is not None:
        registry.request_service_stop(first_id, mode.reason)
    newest = registry.newest_attempt(newest.id)
    if newest.is_terminal:
        return Stopped(newest, "ended", service=first_id)
    done = _stop_one(registry, newest, mode, grace_s, me)
    return Stopped(done.record, done.how, service=first_id)


def _first_attempt(registry: ProcessRegistry, first_id: str) -> ProcessRecord | None:
    """The service's first attempt, or ``None`` when it was pruned."""
    try:
        return registry.get(first_id)
    except NotFound:
        return None


def _child_to_stop(record: ProcessRecord) -> None:
    """For an unended process with no live owner: ``NobodyToStop`` (before anything is
    recorded) unless its recorded child runs here, for this process to stop. ``record`` read
    after its lease was found dead: one that ended meanwhile -- its owner releases the lease as
    it writes the end -- has nothing to stop, and no one is missing."""
    from procledger.supervisor.orphans import find_live_child

    if record.is_terminal:
        return
    if find_live_child(record) is None:
        raise NobodyToStop(
            f"process {record.id} has no live supervisor and no live child on this host, so "
            f"nothing would carry out a stop; nothing was recorded. If it is over, record it "
            f"with: procledger abandon {record.id}"
        )


def orphan_running(record: ProcessRecord) -> bool:
    """Whether ``record`` is ``lost`` while its recorded child still runs on this host (pid
    and start time): a kept orphan (``restore --keep-orphans``), which ``stop`` can stop."""
    facts = record.os
    if record.state is not ProcessState.lost_on_restore or facts is None:
        return False
    from procledger.adapters.liveness import runs_here

    return runs_here(facts.pid, facts.start_time, facts.host_id)


def abandon_process(
    registry: ProcessRegistry, record: ProcessRecord, me: LeaseOwner, reason: str | None = None
) -> ProcessRecord:
    """Record an unended process nobody owns as ``abandoned/abandon_requested``, with the owner
    that first started it as evidence and ``reason`` in the diagnostic. ``StillOwned`` while a
    live owner holds it or its recorded child runs on this host."""
    from procledger.domain.diagnostics import clip_diagnostic
    from procledger.supervisor.capture import salvage

    lease = _take_unowned(registry, record, me)
    diagnostic = f"abandoned by {me.owner_id} on request" + (f": {reason}" if reason else "")
    first = record.first_started
    output, tails = salvage(registry, record)
    return registry.record_abandoned(
        record.id,
        TerminalReason.abandon_requested,
        owner=first.owner if first is not None else None,
        at_ms=registry.now_ms(),
        diagnostic=clip_diagnostic(diagnostic),
        lease=lease,
        output=output,
        tails=tails,
    )


def _take_unowned(registry: ProcessRegistry, record: ProcessRecord, me: LeaseOwner) -> Lease:
    """The process's lease, taken from nobody (none, expired) or from a provably dead holder;
    ``StillOwned`` if a live owner holds it or its child still runs here."""
    from procledger.domain.leases import Acquired
    from procledger.supervisor.orphans import find_live_child

    holder = live_owner(registry, record.id, me)
    if holder is not None:
        _refuse(record, f"a live owner ({holder.owner.owner_id}) holds it: procledger stop")
    child = find_live_child(record)
    if child is not None:
        _refuse(record, f"its child (pid {child}) is still running here: procledger stop")
    current = registry.get_lease(record.id)
    if current is None or not current.is_live(registry.now_ms()):
        taken = registry.claim_lease(record.id, me, ABANDON_LEASE_TTL_MS)
    else:
        taken = registry.reclaim_lease(record.id, me, current, ABANDON_LEASE_TTL_MS)
    if not isinstance(taken, Acquired):
        _refuse(record, "another owner took it meanwhile: procledger show")
    return taken.lease


def _refuse(record: ProcessRecord, why: str) -> NoReturn:
    raise StillOwned(f"process {record.id} not abandoned: {why} {record.id}")
