"""The ``records`` read model: one row per process at its latest state.

Besides the whole record (JSON), a row keeps the columns that filters and the change feed
query, so listing never decodes records it does not return.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import orjson

from procledger.adapters.store import Store, Tx
from procledger.domain._model import canonical_json
from procledger.domain.errors import NotFound, StoreError
from procledger.domain.records import ProcessRecord
from procledger.domain.registration import originator_scope_id
from procledger.domain.vocabulary import ProcessState

RECORD_COLUMNS = (
    "process_id, change_seq, status, terminal, waiting, originator_scope_id, identity_kind, "
    "identity_label, definition, created_at_ms, updated_at_ms, record"
)
_TERMINAL_STATES = frozenset(state.value for state in ProcessState if state.is_terminal)
_UPDATED_COLUMNS = [column.strip() for column in RECORD_COLUMNS.split(",")][1:]
# What a write after the registration can change; the rest comes from the registration alone.
_CHANGING_COLUMNS = ("change_seq", "status", "terminal", "waiting", "updated_at_ms", "record")
_UPDATE = (
    "UPDATE {table} SET "
    + ", ".join(f"{column}=?" for column in _CHANGING_COLUMNS)
    + " WHERE process_id=?"
)
_UPSERT = (
    f"INSERT INTO {{table}} ({RECORD_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?) "
    "ON CONFLICT (process_id) DO UPDATE SET "
    + ", ".join(f"{column}=excluded.{column}" for column in _UPDATED_COLUMNS)
)


def document_row(document: Mapping[str, Any]) -> tuple[object, ...]:
    """A row from a record's JSON form (``Process.record_document``): no model round trip."""
    change_seq, status, terminal, waiting, updated_at_ms, record = _changing_values(document)
    definition = document["identity"]["definition"]
    return (
        document["id"],
        change_seq,
        status,
        terminal,
        waiting,
        originator_scope_id(document["originator"]),
        document["identity"]["kind"],
        document["identity"]["label"],
        None if definition is None else canonical_json(definition).decode(),
        document["created_at_ms"],
        updated_at_ms,
        record,
    )


def _changing_values(document: Mapping[str, Any]) -> tuple[object, ...]:
    """The ``_CHANGING_COLUMNS`` of a record's row."""
    return (
        document["change_seq"],
        document["status"],
        int(document["state"] in _TERMINAL_STATES),
        int(document["wait"] is not None),
        document["updated_at_ms"],
        orjson.dumps(document).decode(),
    )


def upsert_records(
    tx: Tx,
    store: Store,
    documents: Iterable[Mapping[str, Any]],
    *,
    must_exist: Collection[str] = (),
) -> None:
    """Write records; those in ``must_exist`` (loaded, not created, by this write) must still
    have a row: a process pruned since the writer loaded it raises ``NotFound`` and the whole
    write rolls back, instead of resurrecting a partial log."""
    fresh: list[tuple[object, ...]] = []
    for document in documents:
        if document["id"] in must_exist:
            values = (*_changing_values(document), document["id"])
            tx.execute(_UPDATE.format(table=store.table("records")), values)
            if tx.rowcount == 0:
                raise NotFound(f"process {document['id']!r} not found")
        else:
            fresh.append(document_row(document))
    if not fresh:
        return
    statement = _UPSERT.format(table=store.table("records"))
    if store.dialect == "postgresql":
        tx.cursor.executemany(statement.replace("?", "%s"), fresh)
    else:
        tx.cursor.executemany(statement, fresh)


def advance_tracking(tx: Tx, store: Store, position: int) -> None:
    tx.execute(
        f"UPDATE {store.table('tracking')} SET position=? WHERE name='records' AND position<?",
        (position, position),
    )


def decode_record(process_id: str, payload: str | bytes) -> ProcessRecord:
    """A stored record; a corrupt one is a ``StoreError`` naming it, not a crash."""
    try:
        return ProcessRecord.model_validate(orjson.loads(payload))
    except Exception as error:
        raise StoreError(f"stored record of process {process_id!r} is corrupt: {error}") from None


def read_record(tx: Tx, store: Store, process_id: str) -> ProcessRecord | None:
    row = tx.execute(
        f"SELECT record FROM {store.table('records')} WHERE process_id=?", (process_id,)
    ).one()
    return None if row is None else decode_record(process_id, row["record"])


def read_records(tx: Tx, store: Store, where: str, params: Sequence[object]) -> list[ProcessRecord]:
    rows = tx.execute(
        f"SELECT process_id, record FROM {store.table('records')} {where}", params
    ).all()
    return [decode_record(row["process_id"], row["record"]) for row in rows]
