"""Fixtures for the async API's tests: every test runs under asyncio and under trio (anyio's
pytest plugin), against a SQLite ledger of its own; every child it starts is killed by exact
pid at teardown (``procs``), and none may be left behind."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def registry_url(tmp_path: Path) -> str:
    """The ``registry`` of these tests: a SQLite file of their own."""
    return f"sqlite:///{tmp_path / 'ledger.db'}"


POOL_THREADS = ("AnyIO worker thread", "Trio thread")
"""Idle workers of anyio's and trio's thread pools, which linger a few seconds by design."""


def _threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if not t.name.startswith(POOL_THREADS)}


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """No child, descriptor or thread of ours outlives the test (``procs`` kills what it
    knows; a child left behind is killed and reaped here by its pid)."""
    before, fds, threads = set(psutil.Process().children()), _open_fds(), _threads()
    yield
    left = [(c.pid, c.status()) for c in set(psutil.Process().children()) - before]
    for child in set(psutil.Process().children()) - before:
        child.kill()
        child.wait(10)
    leaked_fds = sorted(_open_fds() - fds)
    leaked_threads = [t.name for t in _threads() - threads if t.is_alive()]
    assert (left, leaked_fds, leaked_threads) == ([], [], [])


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd" if sys.platform == "linux" else "/dev/fd"))
