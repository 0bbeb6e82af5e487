"""Raw access to a ledger's tables, as someone with the database file or a database login
would have: what the integrity tests tamper with (SQL stays out of ``src`` but not out of the
tests that play the attacker)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg

from procledger.domain.process import process_uuid


class Raw:
    """One connection to the database behind ``url`` (SQLite file or PostgreSQL schema)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.postgres = parts.scheme.startswith("postgres")
        if self.postgres:
            query = dict(parse_qsl(parts.query))
            self.schema = query.pop("schema", "public")
            query.pop("retry_s", None)
            conninfo = urlunsplit(parts._replace(query=urlencode(query)))
            self.conn: Any = psycopg.connect(conninfo, autocommit=True)
            self.events = f'"{self.schema}"."procledger_events"'
        else:
            self.conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
            self.events = "stored_events"

    def table(self, name: str) -> str:
        return f'"{self.schema}"."procledger_{name}"' if self.postgres else f"procledger_{name}"

    def key(self, process_id: str) -> Any:
        key = process_uuid(process_id)
        return key if self.postgres else key.hex

    def run(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        if self.postgres:
            statement = statement.replace("?", "%s")
        cursor = self.conn.execute(statement, tuple(params))
        try:
            return [tuple(row) for row in cursor.fetchall()]
        except (sqlite3.Error, psycopg.ProgrammingError):
            return []

    def state(self, process_id: str, version: int) -> bytes:
        rows = self.run(
            f"SELECT state FROM {self.events} WHERE originator_id=? AND originator_version=?",
            (self.key(process_id), version),
        )
        return bytes(rows[0][0])

    def set_state(self, process_id: str, version: int, state: bytes) -> None:
        self.run(
            f"UPDATE {self.events} SET state=? WHERE originator_id=? AND originator_version=?",
            (state, self.key(process_id), version),
        )

    def replace_in_state(self, process_id: str, version: int, old: bytes, new: bytes) -> None:
        state = self.state(process_id, version)
        assert old in state, (old, state)
        self.set_state(process_id, version, state.replace(old, new))

    def delete_event(self, process_id: str, version: int) -> None:
        self.run(
            f"DELETE FROM {self.events} WHERE originator_id=? AND originator_version=?",
            (self.key(process_id), version),
        )

    def close(self) -> None:
        self.conn.close()
