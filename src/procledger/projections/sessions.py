"""Handle summaries: what a session sees of the processes granted to it, over the ``grants``
and ``records`` read models."""

from __future__ import annotations

from typing import Any

import orjson

from procledger.adapters.sql import grant_rows
from procledger.adapters.sql.store import Tx
from procledger.domain.errors import NotFound, StoreCorrupt
from procledger.domain.registration import HandleDescriptor
from procledger.domain.vocabulary import ProcessStatus
from procledger.projections.filters import ProcessListFilter
from procledger.projections.handles import HandleSummary
from procledger.projections.records import decode_record, read_record


def not_visible(process_id: str) -> NotFound:
    """One message for "not granted to you" and "does not exist": a session learns nothing."""
    return NotFound(f"process {process_id!r} not found")


def _descriptor(row: Any) -> HandleDescriptor:
    try:
        return HandleDescriptor.model_validate(orjson.loads(row["descriptor"]))
    except Exception as error:
        raise StoreCorrupt(
            f"stored grant of process {row['process_id']!r} is corrupt: {type(error).__name__}",
            process_id=str(row["process_id"]),
        ) from None


def _summary(row: Any) -> HandleSummary:
    record = decode_record(row["process_id"], row["record"])
    descriptor = (
        _descriptor(row)
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


def read_handles(
    tx: Tx, session_id: str, selection: ProcessListFilter
) -> tuple[list[HandleSummary], list[str]]:
    """The session's handle summaries, and the ids of processes whose record (or grant) is
    damaged and so left out."""
    summaries: list[HandleSummary] = []
    damaged: list[str] = []
    for row in grant_rows.granted_rows(tx, session_id, selection.conditions()):
        try:
            summaries.append(_summary(row))
        except StoreCorrupt:
            damaged.append(str(row["process_id"]))
    return summaries, damaged


def read_handle_sessions(tx: Tx, process_id: str) -> list[str]:
    if read_record(tx, process_id) is None:
        raise NotFound(f"process {process_id!r} not found")
    return grant_rows.sessions_of(tx, process_id)
