"""Leases: who may write a process's outcome, fenced by a token that only grows.

A claim takes a free or expired lease (or extends one the same incarnation holds); a reclaim
takes a live lease away only from a holder that is provably dead. Both run in one write
transaction with the lease row locked, so exactly one of any number of racing claimants wins.
A terminal process is never leased: the claim checks the state inside that transaction, after
taking the log's write lock, so no terminal can commit between the check and the claim.

Each command is one ``Store.attempt``: a transaction lost mid-way (a PostgreSQL restart) runs
again from scratch, reading the clock and the lease row afresh (docs/design.md §7.3). That is
safe because every run decides on what it reads under the row lock: a claim whose commit
reached the server but not the caller finds the claimant's own lease on the next run and
extends it; a renewal re-checks the lease; a release of a lease no longer current is a no-op.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from procledger.adapters.liveness import ProcProbe
from procledger.adapters.sql import lease_rows, record_rows
from procledger.adapters.sql.store import Tx
from procledger.application.unit_of_work import Ledger, check_live_lease, release_lease_row
from procledger.domain.errors import AlreadyTerminal, NotFound, StoreCorrupt
from procledger.domain.leases import Acquired, Busy, Lease, LeaseOwner
from procledger.domain.records import ProcessRecord
from procledger.projections.records import decode_record, read_record


@dataclass(frozen=True)
class FreeProcess:
    """A process found with its lease free, and the lease taken for the claimant if it was
    wanted. ``record`` is ``None`` when the stored record is damaged (never claimed then);
    ``lapsed`` is the expired lease of the last holder, if it was not released."""

    process_id: str
    record: ProcessRecord | None
    lapsed: Lease | None
    acquired: Lease | None


@dataclass(frozen=True)
class NextFreeClaim:
    """One step of a pass over the processes whose lease is free: the first after ``after``,
    claimed for ``claimant`` for ``ttl_ms`` when ``wants(record, lapsed)`` says so. One value,
    so that the façade (``ProcessRegistry.claim_next_free``), the command and its retried
    transaction pass the question on whole rather than as four parameters each."""

    after: str
    claimant: LeaseOwner
    ttl_ms: int
    wants: Callable[[ProcessRecord, Lease | None], bool]


def lease_from_row(process_id: str, row: Any) -> Lease:
    """A ``leases`` table row as a ``Lease`` (the row's ``released`` flag is not checked)."""
    return Lease(
        process_id=process_id,
        owner=LeaseOwner.model_validate_json(row["owner"]),
        lease_token=row["lease_token"],
        fencing_token=int(row["fencing_token"]),
        claimed_at_ms=int(row["claimed_at_ms"]),
        expires_at_ms=int(row["expires_at_ms"]),
    )


def check_claimable(tx: Tx, process_id: str) -> None:
    """Raise ``NotFound`` for an unknown process and ``AlreadyTerminal`` for an ended one: a
    lease on a terminal process would let its holder believe it may still execute it."""
    terminal = record_rows.is_terminal(tx, process_id)
    if terminal is None:
        raise NotFound(f"process {process_id!r} not found")
    if terminal:
        try:
            record = read_record(tx, process_id)
        except StoreCorrupt:  # the row says terminal; only the message loses the state name
            record = None
        state = record.state.value if record is not None else "terminal"
        raise AlreadyTerminal(state, "lease_claimed", state, process_id=process_id)


def check_ttl(ttl_ms: int) -> None:
    if ttl_ms < 1:
        raise ValueError(f"ttl_ms must be at least 1, not {ttl_ms}")


class Leases:
    """The lease commands of one ledger."""

    def __init__(self, ledger: Ledger, probe: ProcProbe) -> None:
        self.ledger = ledger
        self.probe = probe

    def take(
        self, process_id: str, owner: LeaseOwner, ttl_ms: int, *, observed: Lease | None
    ) -> Acquired | Busy:
        """Claim (``observed`` is None) or reclaim the process's lease."""
        check_ttl(ttl_ms)
        return self.ledger.store.attempt(
            lambda tx: self._take_in(tx, process_id, owner, ttl_ms, observed), write=True
        )

    def _take_in(
        self, tx: Tx, process_id: str, owner: LeaseOwner, ttl_ms: int, observed: Lease | None
    ) -> Acquired | Busy:
        """One run of a claim in the write transaction ``tx``; everything it decides on
        (the clock, the state, the lease row) is read here, so it may run again."""
        # The log lock first, as every append takes it first: a terminal either committed
        # before this check or waits for this claim (docs/design.md §3.5). Batched, the
        # lock goes out with the state read and the lease write with the COMMIT.
        tx.batch()
        self.ledger.store.lock_log(tx)
        check_claimable(tx, process_id)
        now = self.ledger.now_ms()
        row = lease_rows.ensure_locked(tx, process_id)
        if lease_rows.is_held(row, now):
            holder = lease_from_row(process_id, row)
            kept = self._keeps(holder, owner, observed)
            if kept is not None:
                return kept if isinstance(kept, Busy) else self._extend(tx, holder, now, ttl_ms)
        lease = _successor(process_id, owner, row, now, ttl_ms)
        _write(tx, lease)
        return Acquired(lease=lease)

    def _keeps(
        self, holder: Lease, claimant: LeaseOwner, observed: Lease | None
    ) -> Busy | Lease | None:
        """A live holder keeps the lease (``Busy``), or is the claimant itself (its lease, to
        extend), or may be replaced (``None``: only a provably dead holder that still holds
        exactly what the claimant observed).

        A reclaim finds the claimant holding the lease when its own earlier run committed but
        the acknowledgement was lost with the connection: that lease is the claimant's, so it
        is extended rather than reported ``Busy`` against the claimant itself."""
        if holder.owner.same_incarnation(claimant):
            return holder
        if observed is None or holder != observed:
            return Busy(holder=holder)
        if not self.probe.provably_dead(holder.owner, claimant):
            return Busy(holder=holder)
        return None

    @staticmethod
    def _extend(tx: Tx, lease: Lease, now: int, ttl_ms: int) -> Acquired:
        expires_at_ms = now + ttl_ms
        lease_rows.extend(
            tx, lease.process_id, lease.lease_token, lease.fencing_token, expires_at_ms
        )
        return Acquired(lease=lease.model_copy(update={"expires_at_ms": expires_at_ms}))

    def take_next_free(self, claim: NextFreeClaim) -> FreeProcess | None:
        """The next process after ``claim.after`` whose lease is free, claimed in the same write
        transaction when ``claim.wants(record, lapsed)`` says so.

        No log lock: the record row, locked by the search and checked not terminal, orders
        this claim against a terminal write as the log lock does for ``take`` (a terminal
        append updates that row, so it commits before the search or after this claim)."""
        check_ttl(claim.ttl_ms)
        return self.ledger.store.attempt(lambda tx: self._take_next_in(tx, claim), write=True)

    def _take_next_in(self, tx: Tx, claim: NextFreeClaim) -> FreeProcess | None:
        tx.batch()  # the lease write goes out with the COMMIT
        now = self.ledger.now_ms()
        found, row = self._next_free(tx, claim.after, now)
        if found is None:
            return None
        process_id = str(found["process_id"])
        lapsed = lease_from_row(process_id, row) if row and not row["released"] else None
        try:
            record = decode_record(process_id, found["record"])
        except StoreCorrupt:
            return FreeProcess(process_id, None, lapsed, None)
        if not claim.wants(record, lapsed):
            return FreeProcess(process_id, record, lapsed, None)
        return FreeProcess(
            process_id,
            record,
            lapsed,
            take_if_free(tx, process_id, claim.claimant, now, claim.ttl_ms, locked=row),
        )

    @staticmethod
    def _next_free(tx: Tx, after: str, now: int) -> tuple[Any, Any]:
        """The next process whose lease is free by a fresh read of its row, and that row: a
        process the search's snapshot saw free but another worker has claimed since is passed
        over here, so it is never handed out as a visit."""
        while True:
            found = lease_rows.next_free(tx, after, now)
            if found is None:
                return None, None
            row = lease_rows.lease_row(tx, str(found["process_id"]), lock=True)
            if not lease_rows.is_held(row, now):
                return found, row
            after = str(found["process_id"])

    def get(self, process_id: str) -> Lease | None:
        row = self.ledger.store.attempt(lambda tx: lease_rows.lease_row(tx, process_id))
        if row is None:
            self.ledger.read_record(process_id)  # an unknown process is NotFound
            return None
        if row["released"]:
            return None
        return lease_from_row(process_id, row)

    def renew(self, lease: Lease, ttl_ms: int) -> Lease:
        check_ttl(ttl_ms)

        def renew_in(tx: Tx) -> Lease:
            """Re-checks the lease on every run (a repeated extension by the same holder
            just moves the expiry again), with the clock read inside the transaction."""
            tx.batch()  # the extension goes out with the COMMIT
            now = self.ledger.now_ms()
            check_live_lease(tx, lease, now)
            return self._extend(tx, lease, now, ttl_ms).lease

        return self.ledger.store.attempt(renew_in, write=True)

    def release(self, lease: Lease) -> None:
        """Releasing matches the lease's tokens, so a second run is a no-op."""
        self.ledger.store.attempt(lambda tx: _release_in(tx, lease), write=True)


def take_if_free(
    tx: Tx, process_id: str, owner: LeaseOwner, now: int, ttl_ms: int, *, locked: Any = None
) -> Lease | None:
    """Take the process's lease for ``owner`` inside the write transaction ``tx`` unless
    someone holds it live (then ``None``): the row is created if missing and locked first, and
    the new lease gets the next fencing token. The caller has ruled out a terminal process.

    ``locked`` is the lease row as this transaction already read it ``FOR UPDATE``: nobody
    can have changed it since, so it is neither created nor read again (two round trips)."""
    row = locked if locked is not None else lease_rows.ensure_locked(tx, process_id)
    if lease_rows.is_held(row, now):
        return None
    lease = _successor(process_id, owner, row, now, ttl_ms)
    _write(tx, lease)
    return lease


def _release_in(tx: Tx, lease: Lease) -> None:
    """The release, sent with the ``COMMIT`` (one round trip after ``BEGIN``)."""
    tx.batch()
    release_lease_row(tx, lease)


def _successor(process_id: str, owner: LeaseOwner, row: Any, now: int, ttl_ms: int) -> Lease:
    """A new lease for ``owner`` after the one in the locked ``row``: the next fencing token."""
    return Lease(
        process_id=process_id,
        owner=owner,
        lease_token=secrets.token_urlsafe(16),
        fencing_token=int(row["fencing_token"]) + 1,
        claimed_at_ms=now,
        expires_at_ms=now + ttl_ms,
    )


def _write(tx: Tx, lease: Lease) -> None:
    lease_rows.take(
        tx,
        lease.process_id,
        owner_json=lease.owner.model_dump_json(),
        lease_token=lease.lease_token,
        fencing_token=lease.fencing_token,
        claimed_at_ms=lease.claimed_at_ms,
        expires_at_ms=lease.expires_at_ms,
    )
