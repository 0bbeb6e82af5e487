"""Handle summaries: what a session sees of the processes granted to it, over the ``grants``
and ``records`` read models."""

from __future__ import annotations

from typing import Any

import orjson

from procledger.adapters.sql import grants as grant_rows
from procledger.adapters.sql.store import Tx
from procledger.domain.errors import NotFound
from procledger.domain.registration import HandleDescriptor
from procledger.domain.vocabulary import ProcessStatus
from procledger.projections.filters import ProcessListFilter
from procledger.projections.handles import HandleSummary
from procledger.projections.records import decode_record, read_record


def not_visible(process_id: str) -> NotFound:
    """One message for "not granted to you" and "does not exist": a session learns nothing."""
    return NotFound(f"process {process_id!r} not found")


def _summary(row: Any) -> HandleSummary:
    record = decode_record(row["process_id"], row["record"])
    descriptor = (
        HandleDescriptor.model_validate(orjson.loads(row["descriptor"]))
        if row["descriptor"] is not None
        else record.descriptor
        or HandleDescriptor(kind=record.identity.kind, label=record.identity.label)
    )
    return HandleSummary(
        process_id=record.id,
        descriptor=descriptor,
        status=ProcessStatus(record.status),
        definition=record.identity.definition,
    )


def read_handle(tx: Tx, session_id: str, process_id: str) -> HandleSummary:
    row = grant_rows.granted_row(tx, session_id, process_id)
    if row is None:
        raise not_visible(process_id)
    return _summary(row)


def read_handles(tx: Tx, session_id: str, selection: ProcessListFilter) -> list[HandleSummary]:
    rows = grant_rows.granted_rows(tx, session_id, selection.conditions())
    return [_summary(row) for row in rows]


def read_handle_sessions(tx: Tx, process_id: str) -> list[str]:
    if read_record(tx, process_id) is None:
        raise NotFound(f"process {process_id!r} not found")
    return grant_rows.sessions_of(tx, process_id)
