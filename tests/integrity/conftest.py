"""A fresh ledger per test on each store kind (memory, a SQLite file, a PostgreSQL schema), with
the hand-moved clock, and raw access to the same database for the tests that tamper."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from procledger import ProcessRegistry, open_registry
from procledger.testing import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A ledger on disk (a SQLite file, or a PostgreSQL schema), so tests can reach its rows."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return str(request.getfixturevalue("postgres_schema_url"))


@pytest.fixture
def registry(url: str, clock: FakeClock) -> Iterator[ProcessRegistry]:
    opened = open_registry(url, clock=clock)
    try:
        yield opened
    finally:
        opened.close()
