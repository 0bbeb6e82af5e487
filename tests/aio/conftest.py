"""Fixtures for the async API's tests: every test runs under asyncio and under trio (anyio's
pytest plugin), against a SQLite ledger of its own; every child it starts is killed by exact
pid at teardown (``procs``), and none may be left behind."""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

TEST_LIMIT_S = float(os.environ.get("PROCLEDGER_AIO_TEST_LIMIT_S", "120"))
"""How long one async test may take: past it, the test fails where it was awaiting (a hung
wait shows its own line), rather than the whole run waiting for pytest-timeout."""


def _bounded(test: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(test)
    async def bounded(*args: Any, **kwargs: Any) -> Any:
        with anyio.fail_after(TEST_LIMIT_S):
            return await test(*args, **kwargs)

    return bounded


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> None:
    """Each async test runs under ``TEST_LIMIT_S`` (anyio's plugin then runs it)."""
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        pyfuncitem.obj = _bounded(pyfuncitem.obj)


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
