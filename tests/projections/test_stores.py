"""The projections contract on each store: memory, a SQLite file and a PostgreSQL schema."""

from __future__ import annotations

import pytest

from _stores import MemoryCase, PostgresCase, SQLiteCase

from .contract import ProjectionContract


class TestMemoryProjections(MemoryCase, ProjectionContract):
    pass


class TestSQLiteProjections(SQLiteCase, ProjectionContract):
    pass


@pytest.mark.postgres
class TestPostgresProjections(PostgresCase, ProjectionContract):
    pass
