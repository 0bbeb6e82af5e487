"""Helpers shared by the recovery tests: registrations, a recording runner, and worker OS
processes (``_worker.py``) started together (an owner that is provably dead is
``_shared.dead_owner``). (The fake clock is
``procledger.testing.FakeClock``.)"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from _shared import child_env, end_process
from procledger import (
    Lease,
    LeaseOwner,
    Originator,
    ProcessInput,
    ProcessRecord,
    ProcessRegistration,
    ProcessRegistry,
    RecoveryDisposition,
)
from procledger.recovery import RunResult, SweepReport

WORKER_SCRIPT = Path(__file__).with_name("_worker.py")
T0 = 1_700_000_000_000


def register(
    registry: ProcessRegistry,
    process_id: str,
    disposition: RecoveryDisposition | str,
    *,
    argv: Sequence[str] | None = None,
    engine: str | None = None,
    payload: Any = None,
    external: bool = False,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> ProcessRecord:
    """Register engine work (the default), a command (``argv``) or external work."""
    if external:
        spec = ProcessInput.external({"label": process_id})
        env_ref = None
    else:
        if argv is not None:
            spec = ProcessInput.command(list(argv), cwd=cwd)
        else:
            spec = ProcessInput.engine(engine or "test", payload)
        env_ref = registry.store_env(env if env is not None else {"PATH": os.environ["PATH"]})
    return registry.register(
        ProcessRegistration(
            id=process_id,
            input=spec,
            disposition=RecoveryDisposition(disposition),
            originator=Originator.host(),
            env_ref=env_ref,
        )
    )


def opaque_owner(owner_id: str) -> LeaseOwner:
    return LeaseOwner(owner_id=owner_id, incarnation_id=uuid.uuid4().hex)


class RecordingRunner:
    """A fake runner: records each call (process id, lease) and does ``behaviour`` if given."""

    def __init__(
        self,
        behaviour: Callable[[ProcessRecord, Lease, threading.Event], RunResult] | None = None,
    ) -> None:
        self.behaviour = behaviour
        self.calls: list[tuple[ProcessRecord, Lease]] = []

    def __call__(self, record: ProcessRecord, lease: Lease, cancel: threading.Event) -> RunResult:
        self.calls.append((record, lease))
        if self.behaviour is not None:
            return self.behaviour(record, lease, cancel)
        return RunResult(exit_code=0, value={"ran": record.id})

    @property
    def ran(self) -> list[str]:
        return [record.id for record, _ in self.calls]


def kinds(registry: ProcessRegistry, process_id: str) -> list[str]:
    return [event.kind for event in registry.events(process_id)]


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def kill_if_alive(pid: int, expected_cmd: str) -> None:
    """Clean up an orphan this test made, by its exact PID (checked to still be ours)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return
    if expected_cmd in cmdline:
        os.kill(pid, signal.SIGKILL)


class Workers:
    """Worker OS processes forked by one ``_worker.py`` process and started together (every
    one ``ready``, then ``go``). Each worker's PID is recorded; any that outlives its test is
    killed by that PID (after a SIGCONT, in case it was stopped), then the forking process."""

    def __init__(self) -> None:
        self.parents: list[subprocess.Popen[str]] = []
        self.pids: list[int] = []

    def start(self, url: str, owner_ids: Sequence[str], params: dict[str, Any]) -> Started:
        parent = subprocess.Popen(
            [sys.executable, str(WORKER_SCRIPT), url, orjson.dumps(params).decode(), *owner_ids],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        self.parents.append(parent)
        assert parent.stdout is not None
        assert parent.stdin is not None
        pids: dict[int, int] = {}
        while len(pids) < len(owner_ids):  # synchronise on state: every registry is open
            line = parent.stdout.readline()
            word, index, pid = [*line.split(), "", "", ""][:3]
            assert word == "ready", (line, parent.stderr.read() if parent.stderr else "")
            pids[int(index)] = int(pid)
            self.pids.append(int(pid))
        parent.stdin.write("go\n")
        parent.stdin.flush()
        return Started(parent, [pids[index] for index in range(len(owner_ids))])

    def cleanup(self) -> None:
        for pid in self.pids:
            if pid_alive(pid) and any(parent.poll() is None for parent in self.parents):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                    os.kill(pid, signal.SIGKILL)
        for parent in self.parents:
            end_process(parent)


class Started:
    """One batch of workers: their PIDs (in owner order) and, once all ended, their reports."""

    def __init__(self, parent: subprocess.Popen[str], pids: list[int]) -> None:
        self.parent = parent
        self.pids = pids
        self.stderr = ""

    def reports(self, timeout: float = 60) -> dict[int, SweepReport]:
        """Reports by worker index; a worker killed before reporting has none."""
        out, self.stderr = self.parent.communicate(timeout=timeout)
        reports: dict[int, SweepReport] = {}
        for line in out.splitlines():
            word, index, payload = line.split(" ", 2)
            assert word == "report", (line, self.stderr)
            reports[int(index)] = SweepReport.model_validate_json(payload)
        return reports

    def all_reports(self, timeout: float = 60) -> list[SweepReport]:
        reports = self.reports(timeout)
        assert self.parent.returncode == 0, self.stderr
        assert sorted(reports) == list(range(len(self.pids)))
        return [reports[index] for index in range(len(self.pids))]
