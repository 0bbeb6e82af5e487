"""Recovery's re-runs keep their output (issue 15, docs/design.md §14): a command the default
runner re-runs is captured as the Supervisor captures it, so the library read API and
``procledger logs`` show it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from _shared import run_cli
from procledger import LeaseTimings, ProcessRegistry, ProcessState, open_registry
from procledger.application.output import read_output, stored_tail
from procledger.recovery import DefaultRunner, RecoveryWorker, default_stop_policy

from ._support import opaque_owner, register

PRINTS = 'for i in 1 2 3; do echo "out $i"; echo "err $i" >&2; done; exit 3'
"""Three lines to each stream, alternating, then exit 3 (a result, recorded ``exited``)."""


@pytest.fixture
def registry(shared_url: str) -> Iterator[ProcessRegistry]:
    opened = open_registry(shared_url)
    try:
        yield opened
    finally:
        opened.close()


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
