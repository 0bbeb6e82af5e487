"""The shared PostgreSQL fixtures work: a fresh schema per test, dropped afterwards.

In CI this is also the smoke test that a server is really there (the fixture fails, not skips).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest

pytestmark = pytest.mark.postgres


def _schema_of(url: str) -> str:
    [schema] = parse_qs(urlsplit(url).query)["schema"]
    return schema


def _schema_exists(postgres_url: str, schema: str) -> bool:
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name = %s", (schema,)
        ).fetchone()
    assert row is not None
    return bool(row[0])


def test_postgres_schema_url_names_a_fresh_schema(
    postgres_url: str, postgres_schema_url: str
) -> None:
    schema = _schema_of(postgres_schema_url)
    assert schema.startswith("t_")
    assert len(schema) == 2 + 32
    assert postgres_schema_url.partition("?")[0] == postgres_url.partition("?")[0]
    assert not _schema_exists(postgres_url, schema)  # the store creates it


def test_schemas_are_unique_and_dropped_with_their_tables(
    postgres_url: str, postgres_schemas: Callable[[], AbstractContextManager[str]]
) -> None:
    with postgres_schemas() as first, postgres_schemas() as second:
        schema = _schema_of(first)
        assert schema != _schema_of(second)
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
            conn.execute(f'CREATE TABLE "{schema}".t (x int)')
        assert _schema_exists(postgres_url, schema)
    assert not _schema_exists(postgres_url, schema)
