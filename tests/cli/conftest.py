"""Fixtures for end-to-end tests of the ``procledger`` command.

- ``ledger``: a fresh SQLite ledger URL (``postgres_ledger`` for PostgreSQL).
- ``procs`` (``tests/conftest.py``): every process a test creates is recorded and killed *by
  exact pid* at teardown (children write their pid to a file the test names).
- ``Terminal``: ``procledger`` running in a pseudo-terminal that is its controlling terminal, so
  writing ``\\x03`` is a real Ctrl-C (the line discipline sends SIGINT to the foreground group).
- ``supervise_sleeper``: ``procledger run`` supervising a sleeper in such a terminal.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from _shared import Processes

TAKE_TTY = (
    "import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def sleeper(pidfile: Path, seconds: int = 60) -> list[str]:
    """A shell that records its pid, says ``ready`` and becomes ``sleep`` (same pid)."""
    return [
        "sh",
        "-c",
        f'echo $$ > "{pidfile}.tmp" && mv "{pidfile}.tmp" "{pidfile}" && echo ready && '
        f"exec sleep {seconds}",
    ]


IGNORING = """
import os, signal, sys, time
for name in sys.argv[2:]:
    signal.signal(getattr(signal, name), signal.SIG_IGN)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
print("ready", flush=True)
time.sleep(60)
"""


def ignoring(pidfile: Path, *signals: str) -> list[str]:
    """A python child that ignores ``signals``, records its pid and says ``ready``."""
    return [sys.executable, "-c", IGNORING, str(pidfile), *signals]


@pytest.fixture
def ledger(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/ledger.db"


@pytest.fixture
def postgres_ledger(postgres_schema_url: str) -> str:
    return postgres_schema_url


class Terminal:
    """``procledger ARGS...`` with a pseudo-terminal as its controlling terminal."""

    def __init__(self, args: list[str], procs: Processes) -> None:
        self._master, slave = os.openpty()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", TAKE_TTY, "-m", "procledger", *args],
                stdin=slave,
                stdout=slave,
                stderr=slave,
                start_new_session=True,
            )
        finally:
            os.close(slave)
        procs.add(self.process.pid)
        self._output = bytearray()
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, name="test-pty-reader")
        self._reader.start()

    @property
    def output(self) -> str:
        with self._changed:
            return self._output.decode(errors="replace")

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._master, 4096)
            except OSError:  # EIO: every holder of the slave side has closed it
                chunk = b""
            with self._changed:
                self._output.extend(chunk)
                self._changed.notify_all()
            if not chunk:
                return

    def expect(self, pattern: str, timeout: float = 30.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = re.search(pattern, self._output.decode(errors="replace"))
                if found:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._reader.is_alive():
                    raise AssertionError(f"no {pattern!r} in the terminal: {self.output!r}")
                self._changed.wait(min(remaining, 0.1))

    def type(self, text: str) -> None:
        """Type ``text`` at the terminal (what a person's keystrokes send)."""
        os.write(self._master, text.encode())

    def ctrl_c(self) -> None:
        """Type Ctrl-C: the terminal sends SIGINT to its foreground process group."""
        os.write(self._master, b"\x03")

    def wait(self, timeout: float = 60.0) -> int:
        """The command's exit status (its output may still be read: see ``expect``)."""
        return self.process.wait(timeout)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        self._reader.join(30)
        os.close(self._master)


_SLEEPERS = itertools.count()


def supervise_sleeper(
    terminal: Callable[..., Terminal], procs: Processes, url: str, *options: str
) -> tuple[Terminal, psutil.Process]:
    """``procledger --url URL run [OPTIONS] -- <sleeper>`` in a terminal, once the sleeper has
    said ``ready``: the terminal and the sleeper's process."""
    pidfile = procs.pidfile(f"sleeper-{next(_SLEEPERS)}")
    term = terminal("--url", url, "run", *options, "--", *sleeper(pidfile))
    term.expect("ready")
    return term, procs.await_pid(pidfile)


@pytest.fixture
def terminal(procs: Processes) -> Iterator[Callable[..., Terminal]]:
    opened: list[Terminal] = []

    def open_terminal(*args: str) -> Terminal:
        opened.append(Terminal(list(args), procs))
        return opened[-1]

    yield open_terminal
    procs.kill_all()
    for term in opened:
        term.close()
