"""The PostgreSQL half of the store, imported only for ``postgresql://`` URLs.

Keeping psycopg and eventsourcing's PostgreSQL module out of every other module keeps SQLite
commands (and ``procledger`` start-up) from paying for them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from eventsourcing.persistence import StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo

from procledger.adapters.sql.errors import translate
from procledger.adapters.sql.location import StoreLocation
from procledger.adapters.sql.store import Store, Tx, append_in
from procledger.domain.errors import StoreError


class PostgresRecorder(PostgresApplicationRecorder):
    """Like eventsourcing's, with the table lock first so commit order equals id order."""

    store: Store

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.insert_one_statement = pgsql.SQL(
            "INSERT INTO {0}.{1} (originator_id, originator_version, topic, state) "
            "VALUES (%s, %s, %s, %s) RETURNING notification_id"
        ).format(pgsql.Identifier(self.datastore.schema), pgsql.Identifier(self.events_table_name))

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> list[int]:
        with self.store.write() as tx:
            self.store.lock_log(tx)
            ids = append_in(tx, kwargs.get("unit"), stored_events, self._insert_one)
            if ids:
                tx.cursor.execute(
                    pgsql.SQL("NOTIFY {0}").format(pgsql.Identifier(self.channel_name))
                )
        return ids

    def _insert_one(self, tx: Tx, stored: StoredEvent) -> int:
        tx.cursor.execute(
            self.insert_one_statement,
            (stored.originator_id, stored.originator_version, stored.topic, stored.state),
        )
        return int(tx.cursor.fetchone()["notification_id"])


def postgres_env(location: StoreLocation) -> dict[str, str]:
    """eventsourcing's environment for a PostgreSQL location; never merged with os.environ."""
    pg = location.pg
    return {
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_DBNAME": pg["dbname"],
        "POSTGRES_HOST": pg["host"],
        "POSTGRES_PORT": pg["port"],
        "POSTGRES_USER": pg["user"],
        "POSTGRES_PASSWORD": pg["password"],
        "POSTGRES_SCHEMA": location.schema,
        "POSTGRES_POOL_SIZE": "2",
        "POSTGRES_MAX_OVERFLOW": "8",
        "POSTGRES_CONNECT_TIMEOUT": "5",
        "POSTGRES_IDLE_IN_TRANSACTION_SESSION_TIMEOUT": "0",
        "APPLICATION_RECORDER_TOPIC": f"{__name__}:PostgresRecorder",
    }


def attach(store: Store, recorder: Any, datastore: Any) -> None:
    """Let ``store`` run its transactions on eventsourcing's pooled datastore."""
    recorder.store = store
    store.postgres = datastore
    store.log_lock = list(recorder.lock_table_statements)


def _connect(location: StoreLocation) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(make_conninfo(connect_timeout=5, **location.pg), autocommit=True)
    except psycopg.Error as error:
        raise translate(error, f"store URL {location.masked!r}: cannot connect") from None


@contextmanager
def schema_opening_lock(location: StoreLocation) -> Iterator[None]:
    """eventsourcing re-runs ``CREATE OR REPLACE FUNCTION`` on every open, and two processes
    doing that at once fail with "tuple concurrently updated". A session advisory lock, held on
    a side connection while the registry is constructed, makes concurrent opens wait instead.
    """
    with _connect(location) as conn:  # closing the connection releases the lock
        conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (f"procledger:{location.schema}",))
        yield


def create_schema(location: StoreLocation) -> None:
    """Create the URL's schema if it is missing (racing creators are fine)."""
    with _connect(location) as conn:
        try:
            conn.execute(
                pgsql.SQL("CREATE SCHEMA IF NOT EXISTS {0}").format(
                    pgsql.Identifier(location.schema)
                )
            )
        except psycopg.errors.UniqueViolation:
            pass  # another process created it at the same moment
        except psycopg.Error as error:
            raise StoreError(f"store URL {location.masked!r}: {error}".strip()) from None
