"""Readiness probes of supervised runs (docs/design.md §15), with real processes.

Each child writes its pid to a file the test names (``procs``: killed by exact pid at teardown)
and becomes ready only once the test creates a ``go`` file, so "not ready yet" is observed
before readiness without sleeping.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from _shared import Processes
from procledger import (
    ProcessRegistry,
    ProcessState,
    Readiness,
    TerminalReason,
)
from procledger.supervisor.supervisor import Supervisor

CHILD = r"""
import os, socket, sys, time
pidfile, go, how, arg = sys.argv[1:5]
with open(pidfile + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(pidfile + ".tmp", pidfile)
print("booting", flush=True)
deadline = time.monotonic() + 30
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.005)
if how == "port":
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", int(arg)))
    with open(go + ".listen", "w") as f:
        f.write(str(time.time()))
    server.listen()
elif how == "output":
    print("noise", file=sys.stderr, flush=True)
    print(f"listening on {arg}", file=sys.stderr, flush=True)
elif how == "file":
    open(arg, "w").close()
elif how == "notify":
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.sendto(b"STATUS=up\nREADY=1", os.environ["NOTIFY_SOCKET"])
elif how == "exit":
    sys.exit(3)
time.sleep(60)
"""


def child(pidfile: Path, go: Path, how: str, arg: object = "") -> list[str]:
    return [sys.executable, "-c", CHILD, str(pidfile), str(go), how, str(arg)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def ready_after_go(
    supervisor: Supervisor,
    registry: ProcessRegistry,
    procs: Processes,
    tmp_path: Path,
    *,
    how: str,
    arg: object,
    ready: Readiness,
) -> tuple[str, Path]:
    """Start the child; check it is running and not ready; let it go; wait until ready."""
    pidfile, go = procs.pidfile(f"{how}.pid"), tmp_path / f"{how}.go"
    handle = supervisor.start(child(pidfile, go, how, arg), ready=ready)
    procs.await_pid(pidfile)
    before = registry.get(handle.process_id)
    assert (before.state, before.ready_at_ms) == (ProcessState.running, None)
    go.touch()
    record = supervisor.wait_ready(handle, timeout=30)
    assert record.state is ProcessState.running
    assert record.ready_at_ms is not None
    events = [e for e in registry.events(handle.process_id) if e.kind == "ready"]
    assert len(events) == 1
    assert events[0].payload["ready_at_ms"] == record.ready_at_ms
    assert events[0].payload["probes"] == ready.probes
    supervisor.stop(handle, "kill")
    return handle.process_id, go


def test_ready_port(
    supervisor: Supervisor, registry: ProcessRegistry, procs: Processes, tmp_path: Path
) -> None:
    port = free_port()
    pid, go = ready_after_go(
        supervisor, registry, procs, tmp_path, how="port", arg=port, ready=Readiness(port=port)
    )
    listened_ms = float(Path(f"{go}.listen").read_text()) * 1000
    ready_at = registry.get(pid).ready_at_ms
    assert ready_at is not None
    assert listened_ms - 5 <= ready_at <= listened_ms + 5_000


def test_ready_output_matches_a_line_of_either_stream(
    supervisor: Supervisor, registry: ProcessRegistry, procs: Processes, tmp_path: Path
) -> None:
    ready = Readiness(output=r"listening on \d+")
    ready_after_go(supervisor, registry, procs, tmp_path, how="output", arg=8123, ready=ready)


def test_ready_file(
    supervisor: Supervisor, registry: ProcessRegistry, procs: Processes, tmp_path: Path
) -> None:
    flag = tmp_path / "ready.flag"
    ready = Readiness(file=str(flag))
    ready_after_go(supervisor, registry, procs, tmp_path, how="file", arg=flag, ready=ready)


def test_ready_notify_with_a_plain_sd_notify_datagram(
    supervisor: Supervisor, registry: ProcessRegistry, procs: Processes, tmp_path: Path
) -> None:
    ready = Readiness(notify=True)
    ready_after_go(supervisor, registry, procs, tmp_path, how="notify", arg="", ready=ready)


def test_all_probes_must_hold(
    supervisor: Supervisor, registry: ProcessRegistry, procs: Processes, tmp_path: Path
) -> None:
    """The file exists from the start, but readiness waits for the output too."""
    flag = tmp_path / "early.flag"
    flag.touch()
    ready = Readiness(file=str(flag), output=r"listening on \d+")
    ready_after_go(supervisor, registry, procs, tmp_path, how="output", arg=1, ready=ready)


def test_ready_timeout_stops_the_tree_and_fails(
    supervisor: Supervisor, registry: ProcessRegistry, procs: Processes, tmp_path: Path
) -> None:
    pidfile = procs.pidfile("never.pid")
    ready = Readiness(port=free_port(), timeout_s=1.0)
    handle = supervisor.start(child(pidfile, tmp_path / "never.go", "port", 1), ready=ready)
    process = procs.await_pid(pidfile)
    record = supervisor.wait_ready(handle, timeout=30)
    assert (record.state, record.reason) == (ProcessState.failed, TerminalReason.ready_timeout)
    assert record.ready_at_ms is None
    assert record.diagnostic is not None
    assert "not ready within 1 s" in record.diagnostic
    assert record.finished_at_ms is not None
    assert record.started_at_ms is not None
    assert 900 <= record.finished_at_ms - record.started_at_ms <= 15_000
    procs.assert_dead(process)
    assert record.status == "failed"


def test_a_child_that_exits_first_is_never_ready(
    supervisor: Supervisor, registry: ProcessRegistry, procs: Processes, tmp_path: Path
) -> None:
    pidfile, go = procs.pidfile("exits.pid"), tmp_path / "exits.go"
    go.touch()
    handle = supervisor.start(child(pidfile, go, "exit", ""), ready=Readiness(notify=True))
    record = supervisor.wait_ready(handle, timeout=30)
    assert (record.state, record.exit_code, record.ready_at_ms) == (ProcessState.exited, 3, None)
    assert "ready" not in [event.kind for event in registry.events(handle.process_id)]


def test_an_output_probe_needs_capture(supervisor: Supervisor, registry: ProcessRegistry) -> None:
    with pytest.raises(ValueError, match="captured"):
        supervisor.start(["true"], ready=Readiness(output="x"), capture=False)
    assert registry.list_processes() == []
