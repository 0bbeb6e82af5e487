"""Fixtures for the async API's tests: every test runs under asyncio and under trio (anyio's
pytest plugin), against a SQLite ledger of its own; every child it starts is killed by exact
pid at teardown (``procs``), and none may be left behind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from procledger import LeaseOwner, ProcessRegistry, open_registry


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[ProcessRegistry]:
    opened = open_registry(f"sqlite:///{tmp_path / 'ledger.db'}")
    yield opened
    opened.close()


@pytest.fixture
def owner() -> LeaseOwner:
    return LeaseOwner.local_process("aio-test")


@pytest.fixture(autouse=True)
def no_children_left() -> Iterator[None]:
    """No child of this test process outlives the test (``procs`` kills what it knows)."""
    before = set(psutil.Process().children())
    yield
    left = [(c.pid, c.status()) for c in set(psutil.Process().children()) - before]
    for child in set(psutil.Process().children()) - before:
        child.kill()
        child.wait(10)
    assert not left, f"children left behind: {left}"
