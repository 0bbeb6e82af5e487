"""Fixtures for tests that run real processes.

- ``procs`` (``tests/conftest.py``): every process a test creates is recorded (children write
  their pid to a file the test names; the test waits for it) and killed *by exact pid* at
  teardown, even when the test failed half way.
- ``no_leaks`` (autouse): the open descriptors, the threads and the child processes of this
  test process are the same after each test as before it -- on every path.
- ``in_thread``: run a blocking call in a thread, to cancel or stop it from the test.
- ``make_supervisor``, ``supervisor``: Supervisors on the test's ``registry``, owned by its
  ``owner`` (both ``tests/conftest.py``), each shut down after the test.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from _shared import Processes
from procledger import LeaseOwner, ProcessRegistry, StopPolicy, Supervisor

PROGRAMS = Path(__file__).with_name("programs.py")
FD_DIR = "/proc/self/fd" if sys.platform == "linux" else "/dev/fd"


def program(mode: str, *args: str | Path) -> list[str]:
    """argv running one of ``programs.py``'s modes."""
    return [sys.executable, str(PROGRAMS), mode, *map(str, args)]


def _open_fds() -> set[str]:
    return set(os.listdir(FD_DIR))


def _children() -> list[psutil.Process]:
    return list(psutil.Process().children())


@pytest.fixture(autouse=True)
def no_leaks(procs: Processes) -> Iterator[None]:
    """Descriptors, threads and child processes after the test equal those before it."""
    fds, threads = _open_fds(), set(threading.enumerate())
    children = set(_children())
    yield
    leaks = {
        "fds": sorted(_open_fds() - fds),
        "threads": [t.name for t in set(threading.enumerate()) - threads],
        "children": [(c.pid, c.status()) for c in set(_children()) - children],
    }
    procs.kill_all()
    for child in set(_children()) - children:  # a leaked child: kill and reap it by its pid
        child.kill()
        os.waitpid(child.pid, 0)
    assert not any(leaks.values()), f"leaked: {leaks}"


class Call:
    """A blocking call running in a thread; ``result`` re-raises what it raised."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._fn = fn
        self._outcome: tuple[bool, Any] | None = None
        self.thread = threading.Thread(target=self._run, name="test-call")
        self.thread.start()

    def _run(self) -> None:
        try:
            self._outcome = (True, self._fn())
        except BaseException as exc:
            self._outcome = (False, exc)

    def result(self, timeout: float = 20.0) -> Any:
        self.thread.join(timeout)
        if self._outcome is None:
            raise AssertionError(f"the call did not return within {timeout} s")
        ok, value = self._outcome
        if not ok:
            raise value
        return value


StartCall = Callable[[Callable[[], Any]], Call]


@pytest.fixture
def in_thread(procs: Processes) -> Iterator[StartCall]:
    """Start calls in threads; at teardown, after their processes are killed, join them."""
    calls: list[Call] = []

    def start(fn: Callable[[], Any]) -> Call:
        calls.append(Call(fn))
        return calls[-1]

    yield start
    procs.kill_all()
    for call in calls:
        call.thread.join(10)


@pytest.fixture
def make_supervisor(
    registry: ProcessRegistry, owner: LeaseOwner
) -> Iterator[Callable[..., Supervisor]]:
    """``make(**options)``: a Supervisor on ``registry`` (by default owned by ``owner`` and
    stopping with a 5 s grace), shut down after the test so that no child outlives it."""
    made: list[Supervisor] = []

    def make(**options: Any) -> Supervisor:
        options.setdefault("owner", owner)
        options.setdefault("stop", StopPolicy(grace_s=5.0))
        made.append(Supervisor(registry, **options))
        return made[-1]

    yield make
    for supervisor in made:
        supervisor.shutdown(grace_s=1.0)


@pytest.fixture
def supervisor(make_supervisor: Callable[..., Supervisor], tmp_path: Path) -> Supervisor:
    """One Supervisor of ``make_supervisor``'s, capturing output under the test's folder."""
    return make_supervisor(output_dir=tmp_path / "output")
