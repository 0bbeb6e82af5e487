"""The reads a recovery worker walks by (docs/design.md §3.6): the processes that have not
ended, the live leases held on them, and one process's record with its lease.

Each is one read transaction, run again from scratch if it is lost mid-way (``Store.attempt``),
and each answers with domain objects: recovery decides on records and leases, never on rows,
and the SQL stays in ``adapters/sql`` (docs/design.md §1.2).
"""

from __future__ import annotations

from typing import Any

from procledger.adapters.sql import lease_rows, record_rows
from procledger.adapters.sql.store import Store, Tx
from procledger.application.leases import lease_from_row
from procledger.domain.leases import Lease
from procledger.domain.records import ProcessRecord
from procledger.projections.records import read_record

__all__ = ["held_leases", "non_terminal_ids", "record_and_lease"]


def non_terminal_ids(store: Store) -> list[str]:
    """Ids of the processes that have not ended, in code point order."""
    return store.attempt(record_rows.non_terminal_ids)


def held_leases(store: Store, now_ms: int) -> list[Lease]:
    """The live leases at ``now_ms`` of the processes that have not ended, by process id."""
    rows = store.attempt(lambda tx: lease_rows.held(tx, now_ms))
    return [lease_from_row(str(row["process_id"]), row) for row in rows]


def record_and_lease(store: Store, process_id: str) -> tuple[ProcessRecord, Lease | None] | None:
    """The process's record and its stored lease (``None`` when released, never claimed or
    the process has ended); ``None`` for a process that does not exist (or was pruned)."""
    record, row = store.attempt(lambda tx: _record_and_row(tx, process_id))
    if record is None:
        return None
    if row is None or row["released"]:
        return record, None
    return record, lease_from_row(process_id, row)


def _record_and_row(tx: Tx, process_id: str) -> tuple[ProcessRecord | None, Any]:
    """The record and, unless it has ended (or is gone), its ``leases`` row: safe to run
    again, since it only reads."""
    record = read_record(tx, process_id)
    if record is None or record.state.is_terminal:
        return record, None
    return record, lease_rows.lease_row(tx, process_id)
