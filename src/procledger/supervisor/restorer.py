"""``Supervisor.restore``: accounting for this owner's processes left behind by a supervisor that
is gone (docs/design.md §3.6, §6.2, §6.3).

First the outbox is delivered: an outcome the gone supervisor knew but could not record is
recorded as it was. Then each non-terminal process this owner first started, whose holder is
gone, is taken over and recorded ``lost`` -- its tree stopped first unless orphans are kept --
and its completion notification published again with its original handle and command id.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING

from procledger.application.outbox import deliver_outbox
from procledger.domain.diagnostics import clip_diagnostic
from procledger.domain.errors import InvalidTransition, LeaseLost, NotFound
from procledger.domain.leases import Acquired, Lease, LeaseOwner, LeaseTimings
from procledger.domain.records import ProcessRecord
from procledger.supervisor import orphans
from procledger.supervisor.capture import salvage
from procledger.supervisor.decide import event_ids
from procledger.supervisor.execution import StopPolicy
from procledger.supervisor.publishing import Publisher
from procledger.supervisor.terminals import TerminalWriter

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = ["Restorer"]


class Restorer:
    """Restores as the module docstring says, as ``owner``."""

    def __init__(
        self,
        registry: ProcessRegistry,
        owner: LeaseOwner,
        settings: tuple[LeaseTimings, StopPolicy, Path | None],
        terminals: tuple[TerminalWriter, Publisher],
    ) -> None:
        self._registry, self._owner = registry, owner
        self._timings, self._policy, self._output_dir = settings
        self._writer, self._publisher = terminals

    def restore(self, mine: set[str], *, keep_orphans: bool) -> list[ProcessRecord]:
        """Account for this owner's processes left behind by a supervisor that is gone;
        ``mine`` are the processes this supervisor itself keeps (never taken over).

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
        for record in self._registry.list_processes({"status": "running"}):
            if _restorable(record, self._owner.owner_id, mine):
                restored = self._restore_one(record, keep_orphans)
                if restored is not None:
                    written.append(restored)
        return written

    def _deliver(self) -> list[ProcessRecord]:
        """Deliver this store's outbox entries left by gone supervisors, and notify."""
        outbox = self._writer.outbox()
        if outbox is None:
            return []
        delivered = deliver_outbox(self._registry, outbox, ttl_ms=self._timings.ttl_ms)
        for record in delivered:
            self._publisher.publish_again(record)
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
        self._publisher.publish_again(written)
        return written

    def _record_restored(
        self, record: ProcessRecord, lease: Lease, holder: LeaseOwner, keep_orphans: bool
    ) -> ProcessRecord:
        child = orphans.find_live_child(record)
        grace = self._policy.grace_s
        unrecorded = orphans.stop_unrecorded(record, grace, "restore", keep=keep_orphans)
        if unrecorded is not None:
            diagnostic = clip_diagnostic(f"{_gone_line(holder)}; {unrecorded}")
        elif child is None or keep_orphans:
            diagnostic = _restored_diagnostic(holder, child)
        else:
            stop = orphans.stop_tree(record, (signal.SIGTERM,), grace, escalate=True)
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
