"""Stopping and abandoning a process that another program supervises (docs/design.md §8).

One home for the rules both the CLI (`stop`, `abandon`) and the web view (§16) follow, so they
cannot drift apart. A stop succeeds only when someone carries it out: a live owner holding the
lease, asked through the ledger; or, with the owner gone and the recorded child alive on this
host, this process, which stops the tree itself and records the outcome. Otherwise nothing is
recorded and ``NobodyToStop`` says to abandon it. Abandoning takes the lease from nobody (or a
provably dead holder) and records ``abandoned/abandon_requested``.
"""

from __future__ import annotations

import socket
import uuid
from typing import TYPE_CHECKING, NoReturn

from procledger.domain.errors import ProcledgerError
from procledger.domain.vocabulary import TerminalReason

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry
    from procledger.domain.leases import Lease, LeaseOwner
    from procledger.domain.records import ProcessRecord
    from procledger.supervisor.modes import StopMode

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


def host_id() -> str:
    """The liveness adapter's host id (machine and PID namespace) when it has one, else the host
    name: an owner id must name the same host in every `procledger` started on it."""
    from procledger.adapters.liveness import local_identity  # pydantic: only when needed

    identity = local_identity()
    return identity.host_id if identity and identity.host_id else socket.gethostname()


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
    ended. ``NobodyToStop`` (nothing recorded) when neither is possible."""
    if live_owner(registry, record.id, me) is not None:
        return registry.request_stop(record.id, mode.reason), True
    from procledger.supervisor.orphans import find_live_child, stop_orphan

    if find_live_child(record) is None:
        raise NobodyToStop(
            f"process {record.id} has no live supervisor and no live child on this host, so "
            f"nothing would carry out a stop; nothing was recorded. If it is over, record it "
            f"with: procledger abandon {record.id}"
        )
    return stop_orphan(registry, record, mode, grace_s), False


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
