"""Reading the ``records`` read model: stored record JSON back into ``ProcessRecord``.

A damaged row is a ``StoreCorrupt`` naming its process, and only that process is affected.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from procledger.adapters.sql import records as record_rows
from procledger.adapters.sql.records import Condition
from procledger.adapters.sql.store import Tx
from procledger.domain.errors import StoreCorrupt
from procledger.domain.records import ProcessRecord


def decode_record(process_id: str, payload: str | bytes) -> ProcessRecord:
    """A stored record; a corrupt one is a ``StoreCorrupt`` naming it, not a crash."""
    try:
        return ProcessRecord.model_validate(orjson.loads(payload))
    except Exception as error:
        raise StoreCorrupt(
            f"stored record of process {process_id!r} is corrupt: {error}", process_id=process_id
        ) from None


def read_record(tx: Tx, process_id: str) -> ProcessRecord | None:
    payload = record_rows.record_payload(tx, process_id)
    return None if payload is None else decode_record(process_id, payload)


def decode_rows(rows: Sequence[Any]) -> list[ProcessRecord]:
    return [decode_record(row["process_id"], row["record"]) for row in rows]


def read_records(tx: Tx, conditions: Sequence[Condition]) -> list[ProcessRecord]:
    return decode_rows(record_rows.select_records(tx, conditions))
