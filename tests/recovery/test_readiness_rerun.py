"""A recovery re-run keeps the readiness probes of its registration (docs/design.md §15.4):
the ``ready`` fact is recorded, and a ready timeout ends it ``failed``/``ready_timeout``."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import psutil
import pytest

from _shared import Processes, wait_until
from procledger import (
    Originator,
    ProcessInput,
    ProcessRegistration,
    ProcessRegistry,
    ProcessState,
    Readiness,
    RecoveryDisposition,
    TerminalReason,
)
from procledger.recovery import RecoveryWorker, SweepReport

from ._support import opaque_owner

CHILD = r"""
import os, socket, sys, time
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
if sys.argv[3] == "notify":
    socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"READY=1", os.environ["NOTIFY_SOCKET"])
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:
    time.sleep(0.01)
"""


@pytest.fixture
def registry_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/ledger.db"


def register(registry: ProcessRegistry, pid: str, argv: list[str], ready: Readiness) -> None:
    registry.register(
        ProcessRegistration(
            id=pid,
            input=ProcessInput.command(argv, cwd=os.getcwd()),
            disposition=RecoveryDisposition.rerunnable,
            originator=Originator.host(),
            env_ref=registry.store_env({"PATH": os.environ["PATH"]}),
            readiness=ready,
        )
    )


def sweep_in_thread(worker: RecoveryWorker) -> tuple[threading.Thread, list[SweepReport]]:
    reports: list[SweepReport] = []
    thread = threading.Thread(target=lambda: reports.append(worker.sweep()), name="test-sweep")
    thread.start()
    return thread, reports


def test_a_rerun_records_ready(registry: ProcessRegistry, procs: Processes, tmp_path: Path) -> None:
    pidfile, go = procs.pidfile("rerun.pid"), tmp_path / "go"
    register(
        registry, "svc", [sys.executable, "-c", CHILD, str(pidfile), str(go), "notify"],
        Readiness(notify=True),
    )  # fmt: skip
    worker = RecoveryWorker(registry, opaque_owner("w"), output_dir=tmp_path / "out")
    thread, reports = sweep_in_thread(worker)
    try:
        ready = registry.await_ready("svc", timeout=30)
        assert ready.ready_at_ms is not None
        assert ready.state is ProcessState.running
    finally:
        go.touch()
        thread.join(60)
    assert reports[0].ran == ["svc"]
    record = registry.get("svc")
    assert (record.state, record.exit_code) == (ProcessState.exited, 0)


def test_a_rerun_past_its_ready_timeout_fails(
    registry: ProcessRegistry, procs: Processes, tmp_path: Path
) -> None:
    pidfile = procs.pidfile("never.pid")
    argv = [sys.executable, "-c", CHILD, str(pidfile), str(tmp_path / "never"), "quiet"]
    register(registry, "svc", argv, Readiness(file=str(tmp_path / "flag"), timeout_s=1.0))
    worker = RecoveryWorker(registry, opaque_owner("w"), output_dir=tmp_path / "out")
    report = worker.sweep()
    assert report.failed == ["svc"]
    record = registry.get("svc")
    assert (record.state, record.reason) == (ProcessState.failed, TerminalReason.ready_timeout)
    assert record.diagnostic is not None
    assert "not ready within 1 s" in record.diagnostic
    child = int(pidfile.read_text())
    wait_until(lambda: not psutil.pid_exists(child), 10, "the re-run's tree to be stopped")
