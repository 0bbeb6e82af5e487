"""Fixtures of the agent's parts: an anchor under test, with the fake agent (``fake_agent.py``)
as its agent, and the output files' processes and descriptors.

Every process is cleaned up by exact pid: the anchor (its ``Popen``), each agent it started
(pids from the marker file, killed only if they started after the test did), and each child a
test names with ``procs.pidfile``.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from _shared import Processes, child_env, wait_until
from procledger.adapters.direct_output import Follower, Update
from procledger.agent.exit_journal import ExitRecord, read_exits

FAKE_AGENT = Path(__file__).with_name("fake_agent.py")


class AnchorRun:
    """One anchor process and what it leaves: the journal, the agent's marker, its stderr."""

    def __init__(self, directory: Path, procs: Processes) -> None:
        self.journal = directory / "journal"
        self.marker = directory / "agent-marker"
        self.stderr = directory / "anchor-stderr"
        self._procs = procs
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *agent_args: str, anchor_args: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
        """Start ``python -m procledger.agent.anchor`` with the fake agent."""
        self.marker.touch()
        argv = [
            *(sys.executable, "-m", "procledger.agent.anchor", "--journal", str(self.journal)),
            *anchor_args,
            *("--", sys.executable, str(FAKE_AGENT), str(self.marker), *agent_args),
        ]
        with open(self.stderr, "wb") as stderr:
            self.process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                env=child_env(),
            )  # fmt: skip
        return self.process

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def marker_lines(self) -> list[list[str]]:
        return [line.split() for line in self.marker.read_text().splitlines()]

    def starts(self) -> list[tuple[int, float]]:
        """Each start of the agent so far: its pid and its CLOCK_MONOTONIC time."""
        return [(int(f[1]), float(f[2])) for f in self.marker_lines() if f[0] == "start"]

    def await_starts(self, count: int) -> list[tuple[int, float]]:
        wait_until(lambda: len(self.starts()) >= count, 30, f"{count} agent starts")
        return self.starts()

    def await_spawned(self) -> None:
        wait_until(lambda: ["spawned"] in self.marker_lines(), 30, "the agent's children")

    def records(self) -> list[ExitRecord]:
        return read_exits(self.journal)[0]

    def await_record(self, pid: int, *, agent: bool = False) -> ExitRecord:
        def found() -> ExitRecord | None:
            mine = [r for r in self.records() if r.pid == pid and r.agent == agent]
            return mine[0] if mine else None

        record = wait_until(found, 30, f"the journal record of pid {pid}")
        assert record is not None
        return record

    def delays(self) -> list[float]:
        """The restart delays the anchor announced on stderr, in order."""
        lines = self.stderr.read_text().splitlines()
        return [float(line.split("restarting in ")[1].split()[0]) for line in lines
                if "restarting in " in line]  # fmt: skip

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM to the anchor; its exit status."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def cleanup(self, started: float) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()
        for pid, _ in self.starts() if self.marker.exists() else []:
            with contextlib.suppress(psutil.NoSuchProcess):
                agent = psutil.Process(pid)
                if agent.create_time() >= started - 1:
                    agent.kill()


@pytest.fixture
def anchor(tmp_path: Path, procs: Processes) -> Iterator[AnchorRun]:
    """An anchor to start, killed with its agents by exact pid after the test."""
    run = AnchorRun(tmp_path, procs)
    started = time.time()
    yield run
    run.cleanup(started)


def ppid_of(pid: int) -> int:
    """The parent of ``pid`` now, from ``/proc`` (field 4 of stat)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2 :].split()[1])


def start_time_of(pid: int) -> int:
    """Field 22 of ``/proc/<pid>/stat``: what the journal must carry for it."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2 :].split()[19])


# -- the output files (src/procledger/adapters/direct_output.py) ------------------------------


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
