"""Helpers shared by the test packages: polling on a state, the PID recorder behind the ``procs``
fixture (``tests/conftest.py``), reaping a helper process, the environment of a child Python
that must import the procledger under test, Python code and ``procledger`` run in such a child,
a command's registration, an owner that is provably dead, the write transactions a registry
begins, a small file system to fill (``small_tmpfs``, ``fill_up``), and a lifecycle history
driven with OS facts (``os_facts``, ``drive``) for property tests.

Imported as ``_shared``: pytest puts ``tests/`` on ``sys.path`` when it loads the root conftest.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest
from hypothesis import strategies as st

import procledger
from procledger import (
    Originator,
    ProcessInput,
    ProcessRegistration,
    ProcessRegistry,
    RecoveryDisposition,
)
from procledger.adapters.liveness import local_identity, read_process_start
from procledger.domain.leases import LeaseOwner, Liveness
from procledger.domain.process import Process
from procledger.domain.records import OsFacts
from procledger.domain.registration import env_ref_for
from procledger.domain.vocabulary import LifecycleKind
from procledger.testing import LifecycleHistory, apply_to_process

SRC = Path(procledger.__file__).resolve().parents[1]
"""The ``src`` folder of the procledger under test."""

CLI = [sys.executable, "-m", "procledger"]
"""The ``procledger`` command, as a child of the test."""

T = TypeVar("T")

IN_CI = os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}
"""In CI a test that lacks what it needs (a PostgreSQL server, a browser) fails, never skips."""


def wait_until(predicate: Callable[[], T], timeout: float = 20.0, what: str = "") -> T:
    """Synchronise on a state another thread or process reaches: poll ``predicate`` (briefly at
    first, then every 50 ms) and return its first truthy value; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    pause = 0.005
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def child_env(**overrides: str) -> dict[str, str]:
    """This process's environment, with ``src`` first on ``PYTHONPATH`` so that a child Python
    imports the procledger under test; then ``overrides``."""
    path = os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **overrides}


def run_python(
    code: str, *options: str, env: dict[str, str] | None = None, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (``python [OPTIONS] -c CODE``) to completion,
    capturing its output: what importing or running something costs or touches, measured
    where this test process's imports cannot hide it. ``env`` defaults to ``child_env()``."""
    argv = [sys.executable, *options, "-c", code]
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env() if env is None else env,
        check=False,
    )


def run_cli(
    *args: str, url: str | None = None, env: dict[str, str] | None = None, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run ``procledger [--url URL] ARGS...`` to completion, capturing its output. ``env``
    defaults to ``child_env()`` without ``$PROCLEDGER_URL``: the child sees only the store the
    test names."""
    if env is None:
        env = child_env()
        env.pop("PROCLEDGER_URL", None)
    argv = [*CLI, *(["--url", url] if url else []), *args]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


def start_cli(*args: str, url: str, procs: Processes) -> subprocess.Popen[bytes]:
    """``procledger --url URL ARGS...`` started and left running, quiet, seeing only the store
    the test names; its pid is recorded in ``procs`` (killed by it at the end)."""
    env = child_env()
    env.pop("PROCLEDGER_URL", None)
    runner = subprocess.Popen(
        [*CLI, "--url", url, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    procs.add(runner.pid)
    return runner


def end_process(proc: subprocess.Popen[Any]) -> None:
    """Kill a helper process this test started if it still runs, reap it, close its pipes."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def is_dead(process: psutil.Process) -> bool:
    """Gone, or a zombie (a killed orphan may wait for init to reap it)."""
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class Processes:
    """The processes one test created, for assertions and for cleanup by exact pid.

    Children write their pid to a file the test names (``pidfile``); the test waits for it
    (``await_pid``). At teardown every known process is killed, and a pid read only then is
    killed only if that process started after the test did, so a reused pid is never hit.
    """

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

    def await_pid(self, path: Path, timeout: float = 30.0) -> psutil.Process:
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


@contextlib.contextmanager
def small_tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``mount -o size=``) at ``mount``, made here, and unmounted after
    the block: a disk a test can fill without filling the machine's. Skips the test where
    it cannot be mounted (not root, no ``mount``)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root (mount)")
    mount.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
        timeout=30,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True, capture_output=True, timeout=30)


def fill_up(path: Path) -> Path:
    """Write ``path`` (unbuffered, in ever smaller pieces) until its file system is full to
    the last byte (ENOSPC); ``path``, to delete when the disk should have room again."""
    with open(path, "wb", buffering=0) as file:
        for size in (65536, 4096, 512, 1):
            with contextlib.suppress(OSError):
                while True:
                    file.write(b"\0" * size)
    return path


def dead_owner(owner_id: str) -> LeaseOwner:
    """A ``local_process`` owner whose PID really existed on this host and is now gone: a
    short-lived child is spawned, its start time read while it is unreaped, then reaped."""
    mine = local_identity()
    assert mine is not None, "these tests need a readable /proc"
    child = subprocess.Popen(["true"])
    try:
        start = read_process_start(child.pid)  # alive or a zombie: /proc/<pid> still exists
    finally:
        child.wait()
    assert start is not None
    liveness = Liveness(
        kind="local_process",
        host_id=mine.host_id,
        boot_id=mine.boot_id,
        pid=child.pid,
        process_start=start,
    )
    return LeaseOwner(owner_id=owner_id, incarnation_id=uuid.uuid4().hex, liveness=liveness)


def command_registration(process_id: str, argv: Sequence[str] = ("true",)) -> ProcessRegistration:
    """An ``owner_bound`` command registration run in ``/``, with this ``PATH``'s env ref."""
    return ProcessRegistration(
        id=process_id,
        input=ProcessInput.command(list(argv), cwd="/"),
        disposition=RecoveryDisposition.owner_bound,
        originator=Originator.host(),
        env_ref=env_ref_for({"PATH": os.environ.get("PATH", "/usr/bin")}),
    )


def write_transactions(registry: ProcessRegistry) -> list[bool]:
    """Every transaction ``registry``'s store begins from now on (True for a write)."""
    begun: list[bool] = []
    original = registry._store.begin

    def begin(write: bool) -> Any:
        begun.append(write)
        return original(write)

    registry._store.begin = begin  # type: ignore[method-assign]
    return begun


os_facts = st.builds(
    OsFacts,
    pid=st.integers(min_value=1, max_value=2**31 - 1),
    pgid=st.integers(min_value=1, max_value=2**31 - 1),
    start_time=st.one_of(
        st.integers(min_value=0, max_value=2**53),
        st.floats(min_value=0, max_value=1e15, allow_nan=False, allow_infinity=False),
    ),
    host_id=st.text(min_size=1, max_size=40),
)
"""A running process's OS facts (docs/design.md §11.3), over the widest values they take."""


def drive(process: Process, history: LifecycleHistory, facts: OsFacts | None) -> None:
    """The history's commands, with OS facts on the ones that make a process running
    (``apply_to_process`` gives none)."""
    for at_ms, command in enumerate(history.commands, start=20):
        if command.kind is LifecycleKind.started and command.at_ms is not None:
            process.record_started(command.at_ms, at_ms=at_ms, event_id=command.event_id, os=facts)
        elif command.kind is LifecycleKind.backgrounded and command.at_ms is not None:
            process.record_backgrounded(
                command.at_ms, at_ms=at_ms, event_id=command.event_id, os=facts
            )
        else:
            apply_to_process(process, command, at_ms=at_ms)


def kill_agents(state: Path) -> list[int]:
    """Kill every host agent started under the state directory ``state`` -- its anchor (named
    by ``anchor.pid``), the agent and every process below them -- by exact pid; the pids
    killed. The anchor is stopped (SIGSTOP) before its tree is listed, so an agent it starts
    again meanwhile cannot escape. An anchor pid whose process no longer runs
    ``procledger.agent`` is not ours."""
    killed: list[int] = []
    for pidfile in state.glob("procledger/agent/*/anchor.pid"):
        try:
            anchor = psutil.Process(int(pidfile.read_text()))
            if "procledger" not in " ".join(anchor.cmdline()):
                continue
            anchor.suspend()  # frozen first: it must not start an agent we would not see
            tree = [anchor, *anchor.children(recursive=True)]
        except (OSError, ValueError, psutil.Error):
            continue
        for process in tree:
            with contextlib.suppress(psutil.Error):
                process.kill()
                killed.append(process.pid)
        psutil.wait_procs(tree, timeout=5)
    return killed


@contextlib.contextmanager
def as_nobody(work: Callable[[int], None]) -> Iterator[int]:
    """Fork a child that becomes uid 65534 and runs ``work(write_end)``; yields the read end
    of that pipe. On leaving, the child is waited for by its pid (its socket timeout bounds
    it) and must have exited 0; killed by that pid if the block is cut short."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no return, whatever happens
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            work(write_end)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        yield read_end
        _, status = os.waitpid(pid, 0)
        pid = 0
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
