"""Fixtures for the agent's output tests: children from ``programs.py``, started with their
stdout and stderr on files, tracked and killed by exact pid (``procs``), and a check that no
test leaves a descriptor of this process open."""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from procledger.agent.output_files import Follower, Update

PROGRAMS = Path(__file__).with_name("programs.py")
FD_DIR = "/proc/self/fd" if sys.platform == "linux" else "/dev/fd"
DEADLINE = 30.0
"""Seconds before a wait fails the test: a fail-fast net, never a synchronisation."""


def program(mode: str, *args: str | Path) -> list[str]:
    """argv running one of ``programs.py``'s modes."""
    return [sys.executable, str(PROGRAMS), mode, *map(str, args)]


@pytest.fixture(autouse=True)
def no_leaked_fds() -> Iterator[None]:
    """The test's descriptors are all closed when it ends, on every path."""
    before = set(os.listdir(FD_DIR))
    yield
    left = set(os.listdir(FD_DIR)) - before
    assert not left, f"descriptors left open: {sorted(left)}"


@pytest.fixture
def children() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start ``programs.py`` children (``Popen`` arguments passed on); each is killed by its
    exact pid (its ``Popen``, which cannot hit a reused pid: it is our unreaped child) and
    reaped at teardown."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*argv: str | Path, **options: object) -> subprocess.Popen[bytes]:
        child = subprocess.Popen(program(*argv), **options)  # type: ignore[call-overload]
        started.append(child)
        return child

    yield start
    for child in started:
        if child.poll() is None:
            child.kill()
        child.wait()
        if child.stdin is not None:
            child.stdin.close()
        if child.stdout is not None:
            child.stdout.close()


def follow_until(
    follower: Follower, done: Callable[[list[Update]], bool], deadline: float = DEADLINE
) -> list[Update]:
    """Run the follower's event loop (one selector, sleeping until it is ready or its timeout)
    and collect its updates until ``done(updates)``; fail after ``deadline`` s."""
    updates: list[Update] = []
    end = time.monotonic() + deadline
    with selectors.DefaultSelector() as selector:
        selector.register(follower, selectors.EVENT_READ)
        while not done(updates):
            if time.monotonic() > end:
                raise AssertionError(f"follower stalled after {deadline} s: {updates[-3:]}")
            timeout = follower.timeout()
            selector.select(1.0 if timeout is None else timeout)
            updates.extend(follower.read_ready())
    return updates


def reached(path: Path, offset: int) -> Callable[[list[Update]], bool]:
    """``done`` for ``follow_until``: ``path`` reported up to ``offset``."""
    return lambda updates: any(u.path == path and u.offset + len(u.data) >= offset for u in updates)
