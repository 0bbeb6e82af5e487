"""Fixtures for tests that run real processes.

- ``procs``: every process a test creates is recorded (children write their pid to a file the
  test names; the test waits for it) and killed *by exact pid* at teardown, even when the test
  failed half way. A pid read only at teardown is killed only if that process started after the
  test did, so a reused pid is never hit.
- ``no_leaks`` (autouse): the open descriptors, the threads and the child processes of this
  test process are the same after each test as before it -- on every path.
- ``in_thread``: run a blocking call in a thread, to cancel or stop it from the test.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

PROGRAMS = Path(__file__).with_name("programs.py")
FD_DIR = "/proc/self/fd" if sys.platform == "linux" else "/dev/fd"


def program(mode: str, *args: str | Path) -> list[str]:
    """argv running one of ``programs.py``'s modes."""
    return [sys.executable, str(PROGRAMS), mode, *map(str, args)]


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    """Synchronise on a state another process reaches (polls briefly; fails after timeout)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(0.005)


def is_dead(process: psutil.Process) -> bool:
    """Gone, or a zombie (a killed orphan may wait for init to reap it)."""
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class Processes:
    """The processes one test created, for assertions and for cleanup by exact pid."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._started = time.time()
        self._files: list[Path] = []
        self._known: set[psutil.Process] = set()

    def pidfile(self, name: str) -> Path:
        """A path a child will write a pid to; read again at teardown for cleanup."""
        path = self._directory / name
        self._files.append(path)
        return path

    def await_pid(self, path: Path, timeout: float = 10.0) -> psutil.Process:
        """Wait for a child to write ``path``; the process it names."""
        wait_until(path.exists, timeout, f"{path.name} to be written")
        return self.add(int(path.read_text()))

    def add(self, pid: int) -> psutil.Process:
        process = psutil.Process(pid)
        self._known.add(process)
        return process

    @staticmethod
    def assert_dead(process: psutil.Process) -> None:
        """Dead now: the contract says the tree is dead by the time the call returns."""
        assert is_dead(process), f"pid {process.pid} ({process.name()}) is still alive"

    def kill_all(self) -> None:
        for path in self._files:
            if path.exists() and path.read_text().strip():
                self._add_if_ours(int(path.read_text()))
        for process in self._known:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()  # psutil refuses a pid reused since we looked it up

    def _add_if_ours(self, pid: int) -> None:
        try:
            process = psutil.Process(pid)
            if process.create_time() >= self._started - 1:
                self._known.add(process)
        except psutil.NoSuchProcess:
            pass


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    processes = Processes(tmp_path)
    yield processes
    processes.kill_all()


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
