"""What differs between SQLite and PostgreSQL, in one place.

Statements elsewhere in ``adapters/sql`` are written once, with ``?`` placeholders and these
fragments; nothing outside this module asks which database it is talking to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from procledger.adapters.sql.location import DialectName, StoreLocation

if TYPE_CHECKING:  # a type only: importing uuid costs the CLI's fast path a millisecond
    from uuid import UUID

APPLICATION_NAME = "procledger"
"""eventsourcing's application name: the events table is ``<name>_events`` on PostgreSQL."""


class Dialect:
    """The SQLite flavour; ``PostgresDialect`` overrides what PostgreSQL spells otherwise."""

    name: ClassVar[DialectName] = "sqlite"
    big_integer: ClassVar[str] = "INTEGER"
    serial_key: ClassVar[str] = "INTEGER PRIMARY KEY"
    """The journal's order: a rowid alias, not AUTOINCREMENT, which would write
    sqlite_sequence even for an INSERT that ON CONFLICT skips (an fsync per identical retry)."""
    for_update: ClassVar[str] = ""
    """Suffix of a SELECT that locks its rows until commit (SQLite's writer lock suffices)."""
    by_code_point: ClassVar[str] = ""
    """Collation suffix that sorts text by code point, as Python does."""
    notification_id: ClassVar[str] = "rowid"
    keyed_only: ClassVar[str] = " WITHOUT ROWID"
    """Suffix of a small table read and written only by its primary key: SQLite then keeps one
    b-tree instead of a rowid table beside its key's index, so a new row costs a commit one
    page, not two (a ledger created before keeps its table; both read alike)."""
    events_table: str = "stored_events"

    def __init__(self, location: StoreLocation) -> None:
        self.location = location

    def table(self, name: str) -> str:
        """A side table's qualified name (events live in eventsourcing's own table)."""
        return f"procledger_{name}"

    def statement(self, text: str) -> str:
        """``text`` with this driver's placeholders (written with ``?``)."""
        return text

    def table_exists(self, name: str) -> tuple[str, tuple[str, ...]]:
        """A query (and its parameters) that returns a row when the side table ``name``
        exists: opening asks before it reads a table that an older ledger may lack."""
        return (
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?",
            (f"procledger_{name}",),
        )

    def originator_key(self, originator_id: UUID) -> Any:
        """How the events table stores an originator id."""
        return originator_id.hex

    def skip_locked(self, alias: str) -> str:
        """Suffix of a SELECT that locks the rows of ``alias`` it returns and passes over rows
        another transaction has locked. SQLite needs none: a write transaction already holds
        the one writer lock, so no two can be selecting at once."""
        return ""

    def json_text(self, column: str, *path: str) -> str:
        """The text at ``path`` inside a JSON document column."""
        return f"json_extract({column}, '$.{'.'.join(path)}')"

    def raw_text(self, column: str) -> str:
        """A text column read as bytes where the driver would fail the whole query on one
        value that is not UTF-8 (SQLite files can hold any bytes): decoding it is then the
        reader's job, per row, so one damaged row stays one damaged row."""
        return f"CAST({column} AS BLOB)"

    def key_text(self, column: str) -> str:
        """A stream key column read as text (``raw_text`` where a file may hold any bytes):
        a rebuild reads every event's key, and a driver's ``UUID`` per row costs it more
        than a tenth of its time."""
        return self.raw_text(column)

    def key_param(self) -> str:
        """A placeholder for a key read with ``key_text``, compared as the stored key (the
        same text here), so the log's index still serves the comparison."""
        return "CAST(? AS TEXT)"


class PostgresDialect(Dialect):
    name: ClassVar[DialectName] = "postgresql"
    big_integer: ClassVar[str] = "BIGINT"
    serial_key: ClassVar[str] = "BIGSERIAL PRIMARY KEY"
    for_update: ClassVar[str] = " FOR UPDATE"
    by_code_point: ClassVar[str] = ' COLLATE "C"'
    notification_id: ClassVar[str] = "notification_id"
    keyed_only: ClassVar[str] = ""
    _converted: ClassVar[dict[str, str]] = {}

    def __init__(self, location: StoreLocation) -> None:
        super().__init__(location)
        self.events_table = f'"{location.schema}"."{APPLICATION_NAME}_events"'

    def table(self, name: str) -> str:
        return f'"{self.location.schema}"."procledger_{name}"'

    def statement(self, text: str) -> str:
        converted = self._converted.get(text)
        if converted is None:
            converted = self._converted[text] = text.replace("?", "%s")
        return converted

    def originator_key(self, originator_id: UUID) -> Any:
        return originator_id

    def table_exists(self, name: str) -> tuple[str, tuple[str, ...]]:
        return (
            "SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname=? AND tablename=?",
            (self.location.schema, f"procledger_{name}"),
        )

    def skip_locked(self, alias: str) -> str:
        return f" FOR UPDATE OF {alias} SKIP LOCKED"

    def raw_text(self, column: str) -> str:
        return column  # the server refuses invalid UTF-8 on the way in

    def key_text(self, column: str) -> str:
        return f"{column}::text"

    def key_param(self) -> str:
        return "?::uuid"

    def json_text(self, column: str, *path: str) -> str:
        steps = "".join(f" -> '{step}'" for step in path[:-1])
        return f"({column}::jsonb{steps} ->> '{path[-1]}')"
