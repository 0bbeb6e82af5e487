"""Recovery's re-runs keep their output (issue 15, docs/design.md §14): a command the default
runner re-runs is captured as the Supervisor captures it, so the library read API and
``procledger logs`` show it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from _shared import Processes, run_cli, wait_until
from procledger import (
    Lease,
    LeaseTimings,
    OutputUnavailable,
    ProcessRecord,
    ProcessRegistry,
    ProcessState,
    TerminalReason,
)
from procledger.application.output import read_output, stored_tail
from procledger.recovery import DefaultRunner, RecoveryWorker, RunResult, default_stop_policy

from ._support import kinds, opaque_owner, register

PRINTS = 'for i in 1 2 3; do echo "out $i"; echo "err $i" >&2; done; exit 3'
"""Three lines to each stream, alternating, then exit 3 (a result, recorded ``exited``)."""


def test_a_rerun_command_keeps_its_output_for_the_read_api_and_logs(
    registry: ProcessRegistry, shared_url: str
) -> None:
    register(registry, "job", "rerunnable", argv=["sh", "-c", PRINTS])

    report = RecoveryWorker(registry, opaque_owner("worker")).sweep()

    assert report.ran == ["job"]
    record = registry.get("job")
    assert (record.state, record.exit_code) == (ProcessState.exited, 3)
    output = record.output
    assert output is not None
    assert output.capture
    assert output.folder is not None
    assert (output.stdout.written, output.stdout.kept, output.stdout.dropped) == (18, 18, 0)
    assert (output.stderr.written, output.stderr.kept, output.stderr.dropped) == (18, 18, 0)
    stdout = b"".join(c.data for c in read_output(registry, "job", stream="stdout"))
    stderr = b"".join(c.data for c in read_output(registry, "job", stream="stderr"))
    assert stdout == b"out 1\nout 2\nout 3\n"
    assert stderr == b"err 1\nerr 2\nerr 3\n"
    assert stored_tail(registry, "job") == {"stdout": stdout, "stderr": stderr}

    logs = run_cli("logs", "job", "--stream", "stdout", url=shared_url)
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout == "out 1\nout 2\nout 3\n"
    merged = run_cli("logs", "job", url=shared_url)
    assert merged.returncode == 0, merged.stderr
    assert sorted(merged.stdout.splitlines()) == sorted((stdout + stderr).decode().splitlines())


def test_a_rerun_without_capture_keeps_nothing_and_logs_says_so(
    registry: ProcessRegistry, shared_url: str
) -> None:
    register(registry, "quiet", "rerunnable", argv=["sh", "-c", "echo hidden"])
    runner = DefaultRunner(registry, {}, default_stop_policy(LeaseTimings()), capture=False)

    report = RecoveryWorker(registry, opaque_owner("worker"), runner).sweep()

    assert report.ran == ["quiet"]
    output = registry.get("quiet").output
    assert output is not None
    assert not output.capture
    logs = run_cli("logs", "quiet", url=shared_url)
    assert logs.returncode != 0
    assert "without capture" in logs.stderr
    assert "hidden" not in logs.stdout


KILLED = 'echo "out before"; echo "err before" >&2; kill -KILL $$'
"""A line to each stream, then the shell kills itself: a signal death nobody asked for."""


def test_a_rerun_killed_by_a_signal_still_records_its_output(
    registry: ProcessRegistry, shared_url: str
) -> None:
    register(registry, "killed", "rerunnable", argv=["sh", "-c", KILLED])

    report = RecoveryWorker(registry, opaque_owner("worker")).sweep()

    assert report.failed == ["killed"]
    record = registry.get("killed")
    assert record.state is ProcessState.failed
    assert record.diagnostic is not None
    assert "SIGKILL" in record.diagnostic
    output = record.output
    assert output is not None
    assert output.capture
    assert (output.stdout.written, output.stdout.kept, output.stdout.dropped) == (11, 11, 0)
    assert (output.stderr.written, output.stderr.kept, output.stderr.dropped) == (11, 11, 0)
    assert stored_tail(registry, "killed") == {"stdout": b"out before\n", "stderr": b"err before\n"}
    assert kinds(registry, "killed")[-2:] == ["output_captured", "completed"]
    logs = run_cli("logs", "killed", "--stream", "stderr", url=shared_url)
    assert (logs.returncode, logs.stdout) == (0, "err before\n"), logs.stderr


def test_an_owner_bound_run_stopped_with_its_worker_records_its_output(
    registry: ProcessRegistry, procs: Processes, tmp_path: Path
) -> None:
    pidfile = procs.pidfile("child.pid")
    script = f'echo $$ > {pidfile}; echo "working"; exec sleep 60'
    register(registry, "bound", "owner_bound", argv=["sh", "-c", script])
    timings = LeaseTimings(ttl_ms=3_000, renew_ms=1_000)
    worker = RecoveryWorker(registry, opaque_owner("worker"), timings=timings)

    def stop_once_it_has_written() -> None:
        procs.await_pid(pidfile)
        wait_until(lambda: b"working" in b"".join(c.data for c in read_output(registry, "bound")))
        worker.stop()

    stopper = threading.Thread(target=stop_once_it_has_written)
    stopper.start()
    try:
        report = worker.sweep()
    finally:
        stopper.join(30)
    assert report.lost == ["bound"]
    record = registry.get("bound")
    assert (record.state, record.reason) == (
        ProcessState.terminated,
        TerminalReason.runner_shutdown,
    )
    output = record.output
    assert output is not None
    assert (output.stdout.written, output.stdout.kept) == (8, 8)
    assert stored_tail(registry, "bound") == {"stdout": b"working\n", "stderr": b""}


def test_engine_work_has_no_output_and_logs_says_so_in_one_line(
    registry: ProcessRegistry, shared_url: str
) -> None:
    register(registry, "in-python", "rerunnable", engine="compute")

    def compute(record: ProcessRecord, lease: Lease, cancel: threading.Event) -> RunResult:
        return RunResult(value=42)

    report = RecoveryWorker(registry, opaque_owner("worker"), engines={"compute": compute}).sweep()

    assert report.ran == ["in-python"]
    record = registry.get("in-python")
    assert (record.state, record.value, record.output) == (ProcessState.exited, 42, None)
    with pytest.raises(OutputUnavailable, match="engine work"):
        read_output(registry, "in-python")
    logs = run_cli("logs", "in-pyth", url=shared_url)
    assert logs.returncode == 1
    assert logs.stdout == ""
    assert len(logs.stderr.splitlines()) == 1
    assert "in-python" in logs.stderr
    assert "engine work (kind 'compute')" in logs.stderr
