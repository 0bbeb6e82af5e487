"""The change feed: records whose latest change is after a cursor, in log order.

A record's ``change_seq`` is the notification id of the latest event that changed it, so a
page is simply the records with ``change_seq > cursor`` ordered by ``(change_seq, id)``. Each
record appears once, at its latest state (several mutations coalesce into one entry), and a
rebuild reproduces every ``change_seq``, so consumers' cursors stay valid across rebuilds.

Why concurrent writers never make a reader skip a change: every write that touches the records
table appends its events first, and appends are serialised in id order (SQLite's single writer;
PostgreSQL's table lock held to commit). A change with a lower ``change_seq`` is therefore
always committed before one with a higher ``change_seq``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_serializer, model_validator

from procledger.adapters.sql import record_rows
from procledger.adapters.sql.store import Tx, is_stored_int
from procledger.domain.records import ProcessRecord
from procledger.projections.records import decode_rows


class FeedPage(NamedTuple):
    """One page of the change feed: the records, the cursor after the page, and the ids of
    the processes whose changed row is damaged. The cursor passes damaged rows too, so one
    damaged record never stalls a consumer; it is named in ``damaged`` instead (and logged
    by ``changes_since``), so nothing is skipped silently."""

    records: list[ProcessRecord]
    cursor: ChangeCursor
    damaged: list[str]


class ChangeCursor(BaseModel):
    """An opaque position in the change feed; serialises as the integer (``5``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    value: StrictInt = Field(ge=0)

    def __init__(self, value: int | None = None, /, **data: Any) -> None:
        if value is not None:
            data["value"] = value
        super().__init__(**data)

    @classmethod
    def initial(cls) -> ChangeCursor:
        """The position before the first change."""
        return cls(0)

    @classmethod
    def of(cls, cursor: ChangeCursor | int) -> ChangeCursor:
        return cursor if isinstance(cursor, ChangeCursor) else cls.model_validate(cursor)

    @model_validator(mode="before")
    @classmethod
    def _from_int(cls, data: Any) -> Any:
        if isinstance(data, int) and not isinstance(data, bool):
            return {"value": data}
        return data

    @model_serializer(mode="plain")
    def _as_int(self) -> int:
        return self.value

    def __int__(self) -> int:
        return self.value

    def __index__(self) -> int:
        return self.value

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, ChangeCursor):
            return NotImplemented
        return self.value < other.value

    def __le__(self, other: object) -> bool:
        if not isinstance(other, ChangeCursor):
            return NotImplemented
        return self.value <= other.value

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, ChangeCursor):
            return NotImplemented
        return self.value > other.value

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, ChangeCursor):
            return NotImplemented
        return self.value >= other.value

    def __str__(self) -> str:
        return str(self.value)

    def __repr__(self) -> str:
        return f"ChangeCursor({self.value})"


def read_page(tx: Tx, cursor: ChangeCursor, limit: int) -> FeedPage:
    """One page of the change feed after ``cursor``; its cursor is the ``change_seq`` of the
    last row read, healthy or damaged."""
    if limit < 0:
        raise ValueError(f"limit must be at least 0, not {limit}")
    if limit == 0:
        return FeedPage([], cursor, [])
    rows = record_rows.select_changed(tx, cursor.value, limit)
    if not rows:
        return FeedPage([], cursor, [])
    # A damaged SQLite file may hold text or a BLOB in ``change_seq``, which sorts after every
    # number: such a row is named damaged and never becomes the cursor.
    sequenced, unsequenced = [], []
    for row in rows:
        if is_stored_int(row["change_seq"]):
            sequenced.append(row)
        else:
            unsequenced.append(str(row["process_id"]))
    records, damaged = decode_rows(sequenced)
    end = ChangeCursor(sequenced[-1]["change_seq"]) if sequenced else cursor
    return FeedPage(records, end, [*damaged, *unsequenced])
