"""The side tables beside the event log.

``records`` and ``grants`` are read models (projections of the log, rebuildable); ``tracking``
holds the position they reflect. ``leases``, ``envs``, ``journal`` and ``handles`` are not
events: leases change on every renewal (keeping them out of the log keeps loading a process
cheap), environments hold values that must never reach the log, and the journal is the
notification command store. ``heads`` holds each process's last event digest, which
completes the hash chain of its log (docs/design.md §13).
"""

from __future__ import annotations

from procledger.adapters.sql import heads
from procledger.adapters.sql.store import Store


def create_tables(store: Store) -> None:
    """Create every side table and index that is missing (idempotent)."""
    with store.write() as tx:
        tables = [
            *_record_tables(store),
            *_other_tables(store),
            *_code_point_indexes(store),
            *heads.create_statements(store),
        ]
        for statement in tables:
            tx.execute(statement)
        tx.execute(
            f"INSERT INTO {store.table('tracking')} (name, position) VALUES ('records', 0) "
            "ON CONFLICT (name) DO NOTHING"
        )


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
