"""Children whose supervisor is gone: find them by their OS facts, stop their trees, record it
(docs/design.md §6.2, "Restore and shutdown").

A recorded child is *ours* only while its OS pid runs on this host (the same PID namespace)
**and** started at the recorded time: a pid alone may have passed to a stranger. A zombie --
exited, not yet reaped -- counts as dead. Its tree is the child's process group, its
descendants and every process carrying its run marker (``os_seam.RUN_MARKER``), as for a
supervised stop (§6.1); nothing else is ever signalled.

``stop_orphan`` takes the process over the way ``restore`` does (claim the released or expired
lease, or reclaim it from a provably dead holder), stops the tree, and records the outcome with
the lease: the states of a stop with the signal that ended it, and the survivors.
"""

from __future__ import annotations

import signal as signals
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from procledger.adapters.liveness import runs_here, started_at
from procledger.domain.diagnostics import clip_diagnostic
from procledger.domain.errors import InvalidTransition, LeaseLost
from procledger.domain.leases import Acquired, Lease, LeaseOwner, LeaseTimings
from procledger.domain.records import ProcessRecord, StoppedOrphan
from procledger.domain.vocabulary import ProcessState
from procledger.supervisor import os_seam
from procledger.supervisor.capture import salvage
from procledger.supervisor.decide import event_ids
from procledger.supervisor.modes import StopMode

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = [
    "OrphanStop",
    "find_live_child",
    "stop_kept_orphan",
    "stop_orphan",
    "stop_tree",
    "stop_unrecorded",
    "take_over",
]

POLL_S: Final = 0.02
"""How often the end of an orphan (not our child: nothing notifies us) is looked for."""


def find_live_child(record: ProcessRecord) -> int | None:
    """The recorded child's OS pid if it still runs on this host with its recorded start time;
    ``None`` when gone, a zombie, another process under a reused pid, another host's, or when
    the record has no OS facts (``adapters.liveness.runs_here``)."""
    facts = record.os
    if facts is None or not runs_here(facts.pid, facts.start_time, facts.host_id):
        return None
    return facts.pid


def _is_alive(pid: int, start_time: int) -> bool:
    return started_at(pid, start_time)


@dataclass(frozen=True, slots=True)
class OrphanStop:
    """How a stop of an orphan's tree went: the signal the child died of (``None``: it did
    not die, as after an interrupt it ignored), what was sent, who survived SIGKILL, and
    whether the child is gone now."""

    ended_by: int | None
    sent: tuple[int, ...]
    survivors: list[int]
    gone: bool = True


def stop_tree(
    record: ProcessRecord, sigs: tuple[int, ...], grace_s: float, *, escalate: bool
) -> OrphanStop:
    """Send each of ``sigs`` to the recorded child's tree, waiting up to ``grace_s`` for the
    child after each; with ``escalate`` SIGKILL what is left. Signals nothing unless the
    child is alive (``find_live_child``)."""
    pid = find_live_child(record)
    if pid is None or record.os is None:
        return OrphanStop(None, (), [])
    start = int(record.os.start_time)
    tree = os_seam.Tree(pid, event_ids(record.id, record.registration_hash).run_marker)
    sent: list[int] = []
    ended: int | None = None
    for sig in (*sigs, *((signals.SIGKILL,) if escalate else ())):
        alive = _is_alive(pid, start)
        if alive:
            tree.discover()  # the leader runs with its start time: its group is still its own
        tree.signal(sig, child_unreaped=alive)
        sent.append(int(sig))
        wait = os_seam.KILL_SETTLE_S if sig == signals.SIGKILL else grace_s
        if alive and _await_end(pid, start, wait):
            ended = int(sig)
        if ended is not None and not escalate:
            break
    survivors: list[int] = []
    if escalate and not tree.await_gone(os_seam.KILL_SETTLE_S):
        survivors = tree.survivors()
    return OrphanStop(ended, tuple(sent), survivors, gone=not _is_alive(pid, start))


def stop_unrecorded(
    record: ProcessRecord, grace_s: float, who: str, *, keep: bool = False
) -> str | None:
    """A ``starting`` process has no child on record, yet its holder may have spawned one
    before it died: a start records the child (``started``) only after the spawn, and a burst
    of starts spawns a batch before recording it (docs/design.md §6.2). Whatever on this host
    still carries the run's marker is that child or its tree: SIGTERM, SIGKILL after
    ``grace_s`` (``keep``: left running). What was found, for the record's diagnostic
    (``None``: nothing was)."""
    if record.state is not ProcessState.starting:
        return None
    marker = event_ids(record.id, record.registration_hash).run_marker
    survivors: list[int] = []
    if keep:
        found = os_seam.carrying(marker)
    else:
        found, survivors = os_seam.stop_marked(marker, grace_s)
    if not found:
        return None
    pids = ", ".join(map(str, found))
    if keep:
        return (
            f"OS pid {pids} carrying its run marker (spawned, but its start was never "
            "recorded) was left running unsupervised (keep_orphans)"
        )
    text = (
        f"{who} stopped OS pid {pids} carrying its run marker: spawned, but its start was "
        "never recorded"
    )
    return f"{text}; survivors: {', '.join(map(str, survivors))}" if survivors else text


def _await_end(pid: int, start: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _is_alive(pid, start):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)  # polling a stranger's child: nothing else tells us it ended
    return True


def take_over(
    registry: ProcessRegistry,
    record: ProcessRecord,
    owner: LeaseOwner,
    ttl: int = LeaseTimings().ttl_ms,
) -> Lease | None:
    """The process's lease for ``owner`` (for ``ttl`` ms) if its holder is gone (released,
    expired, provably dead), else ``None``.

    Raises:
        AlreadyTerminal: the process has ended.
    """
    current = registry.get_lease(record.id)
    if current is None or not current.is_live(registry.now_ms()):
        taken = registry.claim_lease(record.id, owner, ttl)
    else:
        taken = registry.reclaim_lease(record.id, owner, current, ttl)
    return taken.lease if isinstance(taken, Acquired) else None


_MODE_SIGNALS: Final = {
    StopMode.interrupt: ((signals.SIGINT,), False),
    StopMode.terminate: ((signals.SIGTERM,), True),
    StopMode.kill: ((), True),
}


def stop_orphan(
    registry: ProcessRegistry,
    record: ProcessRecord,
    mode: StopMode | str,
    grace_s: float,
    *,
    owner: LeaseOwner | None = None,
) -> ProcessRecord:
    """Stop the tree of a process whose supervisor is gone, as ``mode`` says, and record it.

    Takes the lease over first (as ``owner``: by default a fresh incarnation of the first
    starter's owner id). Records ``stop_requested`` then ``completed`` with the mode's state
    and reason, the signal that ended the child and the survivors. A child already gone is
    recorded ``lost``; an interrupt the child ignored records only the request.

    Raises:
        LeaseLost: a live (not provably dead) holder keeps the process: it is not an orphan.
        AlreadyTerminal: the process has ended.
        StoreError: the store failed.
    """
    stop_mode = StopMode(mode)
    claimant = owner or _claimant(record)
    lease = take_over(registry, record, claimant)
    if lease is None:
        raise LeaseLost(f"process {record.id!r} is held by a live owner: stop it through it")
    ids = event_ids(record.id, record.registration_hash)
    registry.request_stop(record.id, stop_mode.reason, event_id=ids.stop[stop_mode.reason])
    if find_live_child(record) is None:
        return _record_gone(registry, record, lease, "stop found no live child")
    sigs, escalate = _MODE_SIGNALS[stop_mode]
    result = stop_tree(record, sigs, grace_s, escalate=escalate)
    if result.ended_by is None and not escalate:
        registry.release_lease(lease)
        return registry.get(record.id)
    state = ProcessState(stop_mode.reason.value)
    output, tails = salvage(registry, record)
    return registry.record_completed(
        record.id,
        state,
        stop_mode.reason,
        event_id=ids.completed,
        lease=lease,
        signal=result.ended_by,
        survivors=result.survivors,
        output=output,
        tails=tails,
    )


def stop_kept_orphan(
    registry: ProcessRegistry,
    record: ProcessRecord,
    mode: StopMode | str,
    grace_s: float,
    *,
    by: str,
) -> OrphanStop | None:
    """Stop the tree of the child a ``lost_on_restore`` record left running (``restore
    --keep-orphans``) by its recorded identity -- OS pid and start time on this host, and its
    run marker -- as ``mode`` says, with ``grace_s`` per signal; once it is gone, record how
    (``OrphanStopped``, by the owner id ``by``). ``None`` when no such child runs here
    (nothing is signalled or recorded); an interrupt it ignored records nothing (``gone``
    false).

    Raises:
        StoreError: the store failed (the tree was stopped all the same).
    """
    stop_mode = StopMode(mode)
    if record.state is not ProcessState.lost_on_restore or find_live_child(record) is None:
        return None
    sigs, escalate = _MODE_SIGNALS[stop_mode]
    result = stop_tree(record, sigs, grace_s, escalate=escalate)
    if not result.sent:
        return None  # it ended between the look and the stop
    if result.gone and record.os is not None:
        facts = StoppedOrphan(
            pid=record.os.pid,
            reason=stop_mode.reason,
            sent=list(result.sent),
            signal=result.ended_by,
            survivors=sorted(set(result.survivors)),
            by=by,
        )
        registry.record_orphan_stopped(record.id, facts)
    return result


def _claimant(record: ProcessRecord) -> LeaseOwner:
    first = record.first_started
    return LeaseOwner.local_process(first.owner.owner_id if first else "procledger-orphans")


def _record_gone(
    registry: ProcessRegistry, record: ProcessRecord, lease: Lease, what: str
) -> ProcessRecord:
    pid = record.os.pid if record.os else None
    text = f"{what}: its child (OS pid {pid}) is gone; its outcome is unknown"
    output, tails = salvage(registry, record)
    try:
        return registry.record_lost(
            record.id,
            diagnostic=clip_diagnostic(text),
            event_id=event_ids(record.id, record.registration_hash).lost,
            lease=lease,
            output=output,
            tails=tails,
        )
    except InvalidTransition:
        registry.release_lease(lease)
        return registry.get(record.id)


def describe_stop(record: ProcessRecord, result: OrphanStop, who: str) -> str:
    """What was done to an orphan, for its record's diagnostic: the pid, the signals sent,
    what ended it, and who survived."""
    pid = record.os.pid if record.os else None
    sent = ", ".join(signals.Signals(s).name for s in result.sent) or "nothing"
    ended = signals.Signals(result.ended_by).name if result.ended_by else "nothing (still alive)"
    text = f"{who} stopped orphaned child OS pid {pid} (sent {sent}; ended by {ended})"
    if result.survivors:
        text += f"; survivors: {', '.join(map(str, result.survivors))}"
    return text
