"""Abandoning: how a recovery worker closes a process it may not run (docs/design.md §3.6) --
by a reconciled authority (externally_owned work, whose lease is never ours), or under a lease
claimed for the purpose, after stopping a child the dead holder left running on this host and
keeping what its capture left here (§14).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING

from procledger.domain.diagnostics import clip_diagnostic
from procledger.domain.errors import AuthorityRejected, InvalidTransition, LeaseLost
from procledger.domain.leases import CompletionAuthority, Lease, LeaseOwner
from procledger.domain.records import ProcessRecord
from procledger.domain.vocabulary import TerminalReason
from procledger.recovery.claims import Claimant
from procledger.recovery.plan import Plan
from procledger.recovery.results import Tally
from procledger.recovery.runner import default_stop_policy
from procledger.supervisor import orphans
from procledger.supervisor.capture import salvage

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = ["Abandoner"]


class Abandoner:
    """Carries out a worker's abandon decisions, each outcome added to the pass's tally.

    ``output_dir`` is where the dead holder's run kept its output (``<state dir>/output``
    when ``None``): the terminal carries what is left of it.
    """

    def __init__(self, claimant: Claimant, output_dir: Path | None) -> None:
        self.claimant = claimant
        self.output_dir = output_dir

    @property
    def registry(self) -> ProcessRegistry:
        return self.claimant.registry

    def abandon(
        self, record: ProcessRecord, lease: Lease | None, decision: Plan, tally: Tally
    ) -> None:
        """Abandon as ``decision`` says: by authority, or under a lease claimed (or reclaimed
        from ``lease``'s provably dead holder) for it."""
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
        keeper = self.claimant.claim(process_id, lease if decision.reclaim else None)
        if keeper is None:
            tally.skipped.append(process_id)
            return
        self.abandon_with(record, keeper.lease, reason, decision.evidence, tally)

    def abandon_with(
        self,
        record: ProcessRecord,
        lease: Lease,
        reason: TerminalReason,
        evidence: LeaseOwner | None,
        tally: Tally,
    ) -> None:
        """Abandon with ``lease``; a dead holder's run keeps what its capture left here, and a
        child of it still running here is stopped first (``stop_orphan``)."""
        process_id = lease.process_id
        diagnostic = self.stop_orphan(record)
        output, tails = salvage(self.registry, record, self.output_dir)
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

    def stop_orphan(self, record: ProcessRecord) -> str | None:
        """A recorded child still running on this host (pid and start time) outlived the holder
        whose process is being abandoned: its tree is stopped as ``restore`` does (SIGTERM,
        SIGKILL after the stop grace) and the diagnostic says so -- the ledger never calls a
        process abandoned while its child runs on unmentioned (docs/design.md §3.6). So is a
        child spawned for a ``starting`` one, found by its run marker (``stop_unrecorded``)."""
        grace = default_stop_policy(self.claimant.timings).grace_s
        if orphans.find_live_child(record) is None:
            unrecorded = orphans.stop_unrecorded(record, grace, "sweep")
            return None if unrecorded is None else clip_diagnostic(unrecorded)
        stop = orphans.stop_tree(record, (signal.SIGTERM,), grace, escalate=True)
        return clip_diagnostic(orphans.describe_stop(record, stop, "sweep"))
