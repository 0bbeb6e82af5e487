"""``LeaseKeeper``: the one renewal schedule the Supervisor's ticker and recovery's renewal
thread both drive. Its decisions take ``now``, so they are tested without a clock."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from procledger import (
    Acquired,
    Originator,
    ProcessInput,
    ProcessRegistration,
    open_registry,
)
from procledger.application.lease_keeper import RETRY_S, LeaseKeeper, Renewal
from procledger.domain.errors import LeaseLost, StoreUnavailable
from procledger.domain.leases import Lease, LeaseOwner, LeaseTimings
from procledger.domain.registration import env_ref_for
from procledger.testing import FakeClock

TIMINGS = LeaseTimings(ttl_ms=30_000, renew_ms=10_000)
LEASE = Lease(
    process_id="p",
    owner=LeaseOwner(owner_id="o", incarnation_id="1"),
    lease_token="t",
    fencing_token=1,
    claimed_at_ms=0,
    expires_at_ms=30_000,
)


class Store:
    """A registry whose next ``renew_lease`` answers as told."""

    def __init__(self) -> None:
        self.failure: Exception | None = None
        self.calls = 0

    def renew_lease(self, lease: Lease, ttl_ms: int) -> Lease:
        self.calls += 1
        if self.failure is not None:
            raise self.failure
        return lease.model_copy(update={"expires_at_ms": lease.expires_at_ms + ttl_ms})


def keeper(store: Store, since: float = 100.0) -> LeaseKeeper:
    return LeaseKeeper(store, LEASE, TIMINGS, since=since)


def test_the_schedule_and_the_deadline_count_from_before_the_claim() -> None:
    kept = keeper(Store(), since=100.0)
    assert (kept.is_due(109.9), kept.is_due(110.0)) == (False, True)
    assert kept.wait_s(104.0) == pytest.approx(6.0)
    assert kept.wait_s(200.0) == 0.0
    assert (kept.is_lapsing(119.9), kept.is_lapsing(120.1)) == (False, True)
    assert (kept.is_lapsed(129.9), kept.is_lapsed(130.0)) == (False, True)


def test_a_renewal_moves_both_on_from_its_own_start() -> None:
    store = Store()
    kept = keeper(store)
    assert kept.renew(110.0) is Renewal.renewed
    assert kept.lease.expires_at_ms == LEASE.expires_at_ms + TIMINGS.ttl_ms
    assert kept.due_at == 120.0
    assert not kept.is_lapsed(139.9)
    assert kept.is_lapsed(140.0)


def test_a_store_failure_is_retried_sooner_and_leaves_the_deadline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)  # an outage is logged, not printed (info, not warning)
    store = Store()
    kept = keeper(store)
    store.failure = StoreUnavailable("down")
    assert kept.renew(110.0) is Renewal.retry
    assert kept.due_at == 110.0 + RETRY_S
    assert kept.lease == LEASE
    assert kept.is_lapsed(130.0)
    assert "lease renewal failed: down" in caplog.text


def test_a_refusal_is_lost_and_renew_or_raise_raises() -> None:
    store = Store()
    kept = keeper(store)
    store.failure = LeaseLost("taken")
    assert kept.renew(110.0) is Renewal.lost
    with pytest.raises(LeaseLost):
        kept.renew_or_raise(110.0)
    assert kept.lease == LEASE


def test_a_lease_that_lapsed_while_paused_and_nobody_took_is_claimed_again(
    tmp_path: Path,
) -> None:
    """A holder paused past its ttl (Ctrl-Z on ``procledger run``) keeps its work when nobody
    took the lease meanwhile: a new fencing token, not a killed tree and a record nobody ends."""
    clock = FakeClock()
    registry = open_registry(f"sqlite:///{tmp_path}/ledger.db", clock=clock)
    try:
        owner = LeaseOwner(owner_id="paused", incarnation_id="1")
        _, claimed = registry.register_claimed(
            ProcessRegistration(
                id="p-paused",
                input=ProcessInput.command(["sleep", "60"], str(tmp_path)),
                disposition="owner_bound",
                originator=Originator.host(),
                env_ref=env_ref_for({}),
            ),
            owner,
            TIMINGS.ttl_ms,
        )
        kept = LeaseKeeper(registry, claimed, TIMINGS, since=100.0)
        clock.advance(TIMINGS.ttl_ms + 1)  # paused past the ttl
        assert kept.renew(200.0) is Renewal.renewed
        assert kept.lease.fencing_token > claimed.fencing_token
        assert not kept.is_lapsed(200.0 + TIMINGS.ttl_ms / 1000 - 1)
        clock.advance(TIMINGS.ttl_ms + 1)  # paused again, and this time another holder took it
        other = LeaseOwner(owner_id="other", incarnation_id="2")
        assert isinstance(registry.claim_lease("p-paused", other, TIMINGS.ttl_ms), Acquired)
        assert kept.renew(300.0) is Renewal.lost
    finally:
        registry.close()
