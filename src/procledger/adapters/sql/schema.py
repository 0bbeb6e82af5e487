"""The side tables beside the event log.

``records`` and ``grants`` are read models (projections of the log, rebuildable); ``tracking``
holds the position they reflect. ``leases``, ``envs``, ``journal`` and ``handles`` are not
events: leases change on every renewal (keeping them out of the log keeps loading a process
cheap), environments hold values that must never reach the log, and the journal is the
notification command store. ``heads`` holds each process's last event digest, which
completes the hash chain of its log (docs/design.md §13). ``meta`` holds the schema version.

Creating and migrating the tables is a step of its own (``migrate``), taken by a writer's open
only: a read-only open runs no DDL and takes no write lock (docs/design.md §7.1).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from procledger.adapters.sql import head_rows, service_rows
from procledger.adapters.sql.location import StoreLocation
from procledger.adapters.sql.store import Store, Tx, is_stored_int
from procledger.domain.errors import SchemaTooNew, StoreCorrupt

SCHEMA_VERSION = 2
"""The version of the tables this code creates and reads, kept in the ``meta`` table's
``schema_version`` row (docs/design.md §7.2). Ledgers written before versions were recorded
(0.1.0 and the releases up to this one) have no row and read as version 0; creating whatever is
missing (every statement is ``IF NOT EXISTS``) brings any of them to version 1. Version 2 adds
the named services' tables (``names``, ``ports``, ``services``, docs/design.md §19). A later
change of the tables raises it and adds its step to ``_STEPS``."""

UNVERSIONED = 0
"""The version of a ledger that has tables but no recorded version."""


def stored_version(store: Store) -> int | None:
    """The ledger's schema version, read without writing: ``None`` where there are no ledger
    tables yet (an empty SQLite file, a new PostgreSQL schema, a new ``memory://``), 0 for a
    ledger from before versions were recorded.

    Raises:
        StoreCorrupt: the recorded version is not an integer.
    """
    return store.attempt(version_in)


def check_known(location: StoreLocation, found: int | None) -> None:
    """Refuse a ledger whose tables a newer procledger migrated (``SchemaTooNew``, naming the
    ledger and both versions): this code might misread or damage what it does not know."""
    if found is None or found <= SCHEMA_VERSION:
        return
    raise SchemaTooNew(
        f"ledger {ledger_name(location)}: its schema version is {found}, newer than version "
        f"{SCHEMA_VERSION}, the newest this procledger knows; upgrade procledger to open it",
        found=found,
        known=SCHEMA_VERSION,
    )


def ledger_name(location: StoreLocation) -> str:
    """How a message names a ledger: its file's absolute path, or its schema and URL."""
    if location.sqlite_path:
        return str(Path(location.sqlite_path).absolute())
    if location.in_memory:
        return repr(location.masked)
    return f"in schema {location.schema!r} at {location.masked!r}"


def migrate(store: Store, create_events_table: Callable[[], None]) -> None:
    """Bring the tables to ``SCHEMA_VERSION`` and record it: eventsourcing's events table
    (``create_events_table``), then every step from the stored version on, and the version
    row, in one write transaction -- under the backend's opening lock, and re-reading the
    version inside it, since another process may be opening the same ledger.

    Raises:
        SchemaTooNew: a newer procledger migrated the ledger meanwhile.
    """
    with store.backend.opening_lock():
        create_events_table()
        with store.write() as tx:
            found = version_in(tx)
            check_known(store.location, found)
            if found == SCHEMA_VERSION:
                return
            for version in range(found or UNVERSIONED, SCHEMA_VERSION):
                _STEPS[version](store, tx)
            tx.execute(
                f"INSERT INTO {store.table('meta')} (name, value) VALUES ('schema_version', ?) "
                "ON CONFLICT (name) DO UPDATE SET value=excluded.value",
                (SCHEMA_VERSION,),
            )


def version_in(tx: Tx) -> int | None:
    """``stored_version`` inside ``tx``."""
    if tx.execute(*tx.dialect.table_exists("records")).one() is None:
        return None
    if tx.execute(*tx.dialect.table_exists("meta")).one() is None:
        return UNVERSIONED
    row = tx.execute(
        f"SELECT value FROM {tx.dialect.table('meta')} WHERE name='schema_version'"
    ).one()
    if row is None:
        return UNVERSIONED
    if not is_stored_int(row["value"]):
        raise StoreCorrupt(
            f"ledger {ledger_name(tx.dialect.location)}: the schema version "
            f"{row['value']!r} is not an integer"
        )
    return int(row["value"])


def _create_missing(store: Store, tx: Tx) -> None:
    """Version 0 to 1: create every side table and index that is missing (idempotent), so a
    ledger of any earlier release -- and a new, empty one -- ends with today's tables."""
    tables = [
        *_record_tables(store),
        *_other_tables(store),
        *_code_point_indexes(store),
        *head_rows.create_statements(store),
    ]
    for statement in tables:
        tx.execute(statement)
    tx.execute(
        f"INSERT INTO {store.table('tracking')} (name, position) VALUES ('records', 0) "
        "ON CONFLICT (name) DO NOTHING"
    )


def _add_service_tables(store: Store, tx: Tx) -> None:
    """Version 1 to 2: the named services' tables (docs/design.md §19). Older releases never
    read them, and a ledger without them has no names, ports or desired state to lose."""
    for statement in service_rows.create_statements(store):
        tx.execute(statement)


_STEPS: dict[int, Callable[[Store, Tx], Any]] = {0: _create_missing, 1: _add_service_tables}
"""``_STEPS[n]`` migrates version ``n`` to ``n + 1``, inside the migration's transaction."""


def _record_tables(store: Store) -> list[str]:
    big, cp = store.dialect.big_integer, store.dialect.by_code_point
    t = store.table
    return [
        f"""CREATE TABLE IF NOT EXISTS {t("records")} (
            process_id TEXT PRIMARY KEY,
            change_seq {big} NOT NULL,
            status TEXT NOT NULL,
            terminal INTEGER NOT NULL,
            waiting INTEGER NOT NULL,
            originator_scope_id TEXT NOT NULL,
            identity_kind TEXT NOT NULL,
            identity_label TEXT,
            definition TEXT,
            created_at_ms {big} NOT NULL,
            updated_at_ms {big} NOT NULL,
            record TEXT NOT NULL)""",
        f"CREATE INDEX IF NOT EXISTS procledger_records_feed ON {t('records')} "
        "(change_seq, process_id)",
        # Recovery walks only the processes still going; most of a ledger has ended.
        f"CREATE INDEX IF NOT EXISTS procledger_records_live ON {t('records')} "
        "(process_id) WHERE terminal=0",
        # Pages of lists, in id (code point) order, per filtered column (docs/design.md §5.2).
        f"CREATE INDEX IF NOT EXISTS procledger_records_status ON {t('records')} "
        f"(status, process_id{cp})",
        f"CREATE INDEX IF NOT EXISTS procledger_records_label ON {t('records')} "
        f"(identity_label, process_id{cp})",
        f"CREATE INDEX IF NOT EXISTS procledger_records_created ON {t('records')} (created_at_ms)",
        f"""CREATE TABLE IF NOT EXISTS {t("tracking")} (
            name TEXT PRIMARY KEY,
            position {big} NOT NULL)""",
    ]


def _other_tables(store: Store) -> list[str]:
    big = store.dialect.big_integer
    serial = store.dialect.serial_key
    t = store.table
    return [
        f"""CREATE TABLE IF NOT EXISTS {t("leases")} (
            process_id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            lease_token TEXT NOT NULL,
            fencing_token {big} NOT NULL,
            claimed_at_ms {big} NOT NULL,
            expires_at_ms {big} NOT NULL,
            released INTEGER NOT NULL){store.dialect.keyed_only}""",
        f"""CREATE TABLE IF NOT EXISTS {t("grants")} (
            session_id TEXT NOT NULL,
            process_id TEXT NOT NULL,
            descriptor TEXT,
            PRIMARY KEY (session_id, process_id))""",
        f"CREATE INDEX IF NOT EXISTS procledger_grants_process ON {t('grants')} (process_id)",
        f"""CREATE TABLE IF NOT EXISTS {t("envs")} (
            env_ref TEXT PRIMARY KEY,
            env TEXT NOT NULL)""",
        f"""CREATE TABLE IF NOT EXISTS {t("journal")} (
            seq {serial},
            command_id TEXT NOT NULL UNIQUE,
            session_id TEXT NOT NULL,
            loop_id TEXT NOT NULL,
            process_handle TEXT NOT NULL,
            payload TEXT NOT NULL,
            consumed INTEGER NOT NULL DEFAULT 0)""",
        f"CREATE INDEX IF NOT EXISTS procledger_journal_loop ON {t('journal')} "
        "(session_id, loop_id, seq)",
        f"""CREATE TABLE IF NOT EXISTS {t("handles")} (
            handle TEXT PRIMARY KEY,
            process_id TEXT NOT NULL,
            owner_id TEXT NOT NULL,
            session_id TEXT,
            loop_id TEXT,
            command_id TEXT NOT NULL)""",
        f"CREATE INDEX IF NOT EXISTS procledger_handles_process ON {t('handles')} (process_id)",
        f"""CREATE TABLE IF NOT EXISTS {t("meta")} (
            name TEXT PRIMARY KEY,
            value {big} NOT NULL)""",
    ]


def _code_point_indexes(store: Store) -> list[str]:
    """Indexes in code point order where the primary key's order is not that (PostgreSQL's
    collation): listings by id, and a session's handles by id (docs/design.md §5.2). On SQLite
    the primary keys already give that order, so none is needed."""
    cp, t = store.dialect.by_code_point, store.table
    if not cp:
        return []
    return [
        f"CREATE INDEX IF NOT EXISTS procledger_records_id ON {t('records')} (process_id{cp})",
        f"CREATE INDEX IF NOT EXISTS procledger_grants_session ON {t('grants')} "
        f"(session_id, process_id{cp})",
    ]
