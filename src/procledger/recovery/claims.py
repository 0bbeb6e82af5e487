"""Who an attempt claims as, and the claim itself (docs/design.md §3.5, §3.6).

Every attempt claims as a fresh incarnation of the worker's owner, ``<owner_id>:recovery:<uuid>``,
so a later pass never re-enters a running attempt's lease, and ``drain`` still recognises the
owner's work by the prefix (``is_owned_by``).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Final

from procledger.application.lease_keeper import LeaseKeeper
from procledger.domain.errors import InvalidTransition
from procledger.domain.leases import Acquired, Lease, LeaseOwner, LeaseTimings

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = ["RECOVERY_MARK", "Claimant", "is_owned_by", "recovery_owner_id"]

log = logging.getLogger("procledger.recovery")

RECOVERY_MARK: Final = ":recovery:"
"""Separates a worker's owner id from the attempt id in an attempt's ``owner_id``."""


def recovery_owner_id(owner_id: str) -> str:
    """A fresh attempt's owner id: ``<owner_id>:recovery:<uuid>``."""
    return f"{owner_id}{RECOVERY_MARK}{uuid.uuid4()}"


def is_owned_by(candidate_owner_id: str, owner_id: str) -> bool:
    """Whether ``candidate_owner_id`` is ``owner_id`` itself or one of its recovery attempts."""
    return candidate_owner_id == owner_id or candidate_owner_id.startswith(owner_id + RECOVERY_MARK)


class Claimant:
    """Claims processes for one worker's ``owner``, each claim as a fresh incarnation, and
    keeps what it took with a ``LeaseKeeper`` on the worker's ``timings``."""

    def __init__(self, registry: ProcessRegistry, owner: LeaseOwner, timings: LeaseTimings) -> None:
        self.registry = registry
        self.owner = owner
        self.timings = timings

    def incarnation(self) -> LeaseOwner:
        """A fresh attempt owner: never re-enters another attempt's lease."""
        return LeaseOwner(
            owner_id=recovery_owner_id(self.owner.owner_id),
            incarnation_id=uuid.uuid4().hex,
            liveness=self.owner.liveness,
        )

    def keeper(self, lease: Lease, since: float) -> LeaseKeeper:
        """A keeper of ``lease``, claimed by a call that began at monotonic time ``since``:
        its local deadline counts from then, so time lost in the claim is never counted
        as lease left."""
        return LeaseKeeper(self.registry, lease, self.timings, since=since, log=log)

    def claim(self, process_id: str, observed: Lease | None) -> LeaseKeeper | None:
        """Claim as a fresh incarnation, or reclaim from ``observed`` (a provably dead holder);
        ``None`` when the lease is not ours (busy, or the process ended since we looked)."""
        claimant, ttl, since = self.incarnation(), self.timings.ttl_ms, time.monotonic()
        try:
            if observed is None:
                outcome = self.registry.claim_lease(process_id, claimant, ttl)
            else:
                outcome = self.registry.reclaim_lease(process_id, claimant, observed, ttl)
        except InvalidTransition:  # AlreadyTerminal: it ended since we looked
            return None
        if not isinstance(outcome, Acquired):
            return None
        return self.keeper(outcome.lease, since)
