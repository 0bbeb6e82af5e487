"""An anchor under test, with the fake agent (``fake_agent.py``) as its agent.

Every process is cleaned up by exact pid: the anchor (its ``Popen``), each agent it started
(pids from the marker file, killed only if they started after the test did), and each child a
test names with ``procs.pidfile``.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from _shared import Processes, child_env, wait_until
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
