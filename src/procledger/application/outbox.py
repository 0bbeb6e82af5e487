"""Delivering the local outbox: outcomes known on this host that the store has not accepted
yet (docs/design.md §6.3).

The Supervisor puts a terminal in the outbox (``adapters/outbox.py``) before it writes it to the
store, and deletes it once the store accepted it. An entry still there means its supervisor
could not get through -- it may be waiting for the store still, or it died. ``deliver_outbox``
records such entries the way ``restore`` takes over a process: only when the entry's holder is
gone (lease released, expired or held by a provably dead holder) it claims or reclaims the lease
and records the terminal **with the lease and the entry's own event id**, so a delivery that
races the supervisor's own retry, or runs twice, appends the terminal once.

``restore``, ``sweep``, ``drain`` and ``serve`` call it before they judge anything lost: the true
exit code is recorded even when the supervisor died while the store was down.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from procledger.adapters.outbox import Outbox, OutboxEntry
from procledger.adapters.proc_facts import this_host_id
from procledger.adapters.sql.location import store_key
from procledger.domain.errors import InvalidTransition, LeaseLost, NotFound
from procledger.domain.leases import Acquired, Lease, LeaseOwner, LeaseTimings
from procledger.domain.records import ProcessRecord

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry
    from procledger.application.unit_of_work import Write

__all__ = ["deliver_outbox", "record_entry", "store_key", "this_host_id"]

_log = logging.getLogger("procledger.outbox")


def record_entry(registry: ProcessRegistry, entry: OutboxEntry, lease: Lease) -> ProcessRecord:
    """Record the entry's terminal with ``lease`` and the entry's event id (the one write both
    the Supervisor and a delivery make, so they can never append two terminals).

    Raises:
        LeaseLost, InvalidTransition, StoreError: as ``record_completed``.
    """
    return registry.make(entry_write(registry, entry, lease))


def entry_write(registry: ProcessRegistry, entry: OutboxEntry, lease: Lease) -> Write:
    """The write ``record_entry`` makes, for ``ProcessRegistry.write_all``."""
    return registry.outcome_write(
        entry.process_id, entry.outcome(), event_id=entry.event_id, lease=lease
    )


def deliver_outbox(
    registry: ProcessRegistry, outbox: Outbox, *, ttl_ms: int = LeaseTimings().ttl_ms
) -> list[ProcessRecord]:
    """Record every entry of this store and this host whose holder is gone; see the module
    docstring. Entries whose process ended otherwise, was pruned or re-registered are deleted;
    entries whose holder may still live are left for it.

    Returns:
        The records written, oldest entry first.

    Raises:
        StoreError: the store failed; what was delivered so far stands, the rest stays.
    """
    key, host = store_key(registry.location), this_host_id()
    if key is None or host is None:
        return []
    delivered = []
    for entry in outbox.entries(key):
        if entry.host_id != host:
            continue  # another machine's (a shared home folder): only it can judge its holder
        written = _deliver_one(registry, outbox, entry, ttl_ms)
        if written is not None:
            delivered.append(written)
    return delivered


def _deliver_one(
    registry: ProcessRegistry, outbox: Outbox, entry: OutboxEntry, ttl_ms: int
) -> ProcessRecord | None:
    try:
        record = registry.get(entry.process_id)
    except NotFound:
        outbox.remove(entry)  # pruned since: nothing left to tell
        return None
    if record.registration_hash != entry.registration_hash or record.is_terminal:
        outbox.remove(entry)  # another process under that id, or it ended (maybe by us)
        return None
    lease = _take_over(registry, entry, ttl_ms)
    if lease is None:
        return None  # its holder may be alive: it delivers the entry itself
    try:
        written = record_entry(registry, entry, lease)
    except InvalidTransition:
        registry.release_lease(lease)
        outbox.remove(entry)
        return None
    except LeaseLost:
        return None
    outbox.remove(entry)
    _log.info("process %r: delivered its outcome from the outbox", entry.process_id)
    return written


def _take_over(registry: ProcessRegistry, entry: OutboxEntry, ttl_ms: int) -> Lease | None:
    """The lease, claimed as a fresh incarnation of the entry's owner, if its holder is gone."""
    claimant = LeaseOwner.local_process(entry.lease_owner.owner_id)
    try:
        current = registry.get_lease(entry.process_id)
        if current is None or not current.is_live(registry.now_ms()):
            taken = registry.claim_lease(entry.process_id, claimant, ttl_ms)
        else:
            taken = registry.reclaim_lease(entry.process_id, claimant, current, ttl_ms)
    except (InvalidTransition, NotFound):  # it ended or was pruned meanwhile
        return None
    return taken.lease if isinstance(taken, Acquired) else None
