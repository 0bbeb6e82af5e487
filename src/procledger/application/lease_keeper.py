"""Keeping one lease alive while its work runs: the one renewal schedule.

Both holders of running work -- the Supervisor (its ticker, per run) and a recovery attempt (its
renewal thread) -- keep their lease with a ``LeaseKeeper``. The keeper decides; its driver
owns the thread and the reaction:

- **When to renew.** Every ``renew_ms``; after a transient store failure sooner
  (``RETRY_S`` at most), because a few failed periods in a row are what lets a lease expire
  under work that is still running.
- **When the lease must be treated as lapsed.** By this process's monotonic clock, counted
  from *before* the claim or renewal that set the expiry, so the local deadline is never
  later than the store's -- a paused process that wakes up past it knows without asking
  the store. ``is_lapsed`` says the lease may have expired; ``is_lapsing`` says less than one
  renewal period is left, too little to stop a tree before the lease could be taken over.

Decisions take ``now`` (``time.monotonic()``, taken by the caller) and do no I/O; only
``renew`` and ``renew_or_raise`` talk to the store.
"""

from __future__ import annotations

import logging
from enum import Enum
from typing import Final, Protocol

from procledger.domain.errors import LeaseLost
from procledger.domain.leases import Acquired, Busy, Lease, LeaseOwner, LeaseTimings

__all__ = ["RETRY_S", "LeaseKeeper", "LeaseRenewer", "Renewal"]

RETRY_S: Final = 1.0
"""The longest wait before a renewal that failed on a store error is tried again."""

_log = logging.getLogger("procledger.leases")


class LeaseRenewer(Protocol):
    """What a keeper needs of the registry."""

    def renew_lease(self, lease: Lease, ttl_ms: int) -> Lease: ...

    def claim_lease(self, process_id: str, owner: LeaseOwner, ttl_ms: int) -> Acquired | Busy: ...


class Renewal(Enum):
    """How one renewal attempt went."""

    renewed = "renewed"
    """The store extended the lease: its local deadline moved on."""
    retry = "retry"
    """The store failed (logged): tried again soon, the deadline unchanged."""
    lost = "lost"
    """The store refused: another holder may own the work now."""


class LeaseKeeper:
    """One held lease, its renewal schedule and its local deadline.

    Not thread-safe for renewals: one driver renews. Any thread may read ``lease`` (replaced
    whole on each renewal) and ask the pure questions.
    """

    def __init__(
        self,
        registry: LeaseRenewer,
        lease: Lease,
        timings: LeaseTimings,
        *,
        since: float,
        log: logging.Logger = _log,
    ) -> None:
        """Keep ``lease``, claimed (or last renewed) by a call that began at monotonic time
        ``since``. ``log`` receives the warning of each failed renewal."""
        self._registry = registry
        self._lease = lease
        self._ttl_ms = timings.ttl_ms
        self._ttl_s = timings.ttl_ms / 1000
        self._renew_s = timings.renew_ms / 1000
        self._deadline = since + self._ttl_s
        self._due = since + self._renew_s
        self._log = log

    @property
    def lease(self) -> Lease:
        """The lease as last renewed: the one a write under it must present."""
        return self._lease

    @property
    def due_at(self) -> float:
        """The monotonic time the next renewal is due."""
        return self._due

    def is_due(self, now: float) -> bool:
        """Whether a renewal should be made at ``now``."""
        return now >= self._due

    def wait_s(self, now: float) -> float:
        """How long a driver may sleep at ``now`` before the next renewal is due."""
        return max(0.0, self._due - now)

    def is_lapsed(self, now: float) -> bool:
        """Whether the lease may have expired by ``now``. Checked before a result is written:
        the store accepts a terminal identical to the recorded one without any lease, so a
        holder that slept past its lease must notice on its own."""
        return now >= self._deadline

    def is_lapsing(self, now: float) -> bool:
        """Whether less than one renewal period of the lease is left at ``now``: too late to
        renew safely, since stopping the work (half a period, by default) might then outlast
        the lease."""
        return self._deadline - now < self._renew_s

    def renew(self, now: float) -> Renewal:
        """Renew now (``now`` taken just before the call); never raises for the store.

        A refusal is ``Renewal.lost``; any other failure is logged and retried sooner than
        a period (``Renewal.retry``)."""
        try:
            self.renew_or_raise(now)
        except LeaseLost:
            return self._claim_again(now)
        except Exception as error:  # the store is unreachable: try again soon, not in a loop
            self._due = now + min(self._renew_s, RETRY_S)
            self._log.info("process %r: lease renewal failed: %s", self._lease.process_id, error)
            return Renewal.retry
        return Renewal.renewed

    def _claim_again(self, now: float) -> Renewal:
        """A lease that lapsed while this holder was paused past its ttl (Ctrl-Z, a debugger,
        a laptop asleep) and that nobody took is claimed again, with a new fencing token, and
        the work goes on; a lease another holder took -- or a process that ended meanwhile --
        is lost. The paused holder's pid stayed alive, so no sweep took the work over."""
        lease = self._lease
        try:
            claimed = self._registry.claim_lease(lease.process_id, lease.owner, self._ttl_ms)
        except Exception:  # ended meanwhile, or the store failed: not ours to go on with
            return Renewal.lost
        if not isinstance(claimed, Acquired):
            return Renewal.lost
        self._log.warning(
            "process %r: its lease lapsed while this holder was paused; nobody took it, "
            "claimed again", lease.process_id
        )  # fmt: skip
        self._lease, self._deadline, self._due = (
            claimed.lease,
            now + self._ttl_s,
            now + self._renew_s,
        )
        return Renewal.renewed

    def renew_or_raise(self, now: float) -> Lease:
        """Renew now (``now`` taken just before the call) and return the renewed lease.

        Raises:
            LeaseLost: the store refused; the lease is no longer this holder's.
            Exception: whatever the store raised; the schedule is left as it was.
        """
        self._lease = self._registry.renew_lease(self._lease, self._ttl_ms)
        self._deadline = now + self._ttl_s
        self._due = now + self._renew_s
        return self._lease
