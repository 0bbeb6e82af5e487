"""`run`'s readiness and restart flags and `procledger wait`, end to end (docs/design.md §15).

Every child writes its pid to a file the test names and every detached supervisor is known by
its recorded pid (``procs``: both killed by exact pid at teardown).
"""

from __future__ import annotations

import itertools
import socket
import sys
from pathlib import Path

import orjson
import psutil
import pytest

from _shared import Processes, run_cli, wait_until

from .conftest import sleeper

LATE_S = 0.3
"""How late a restart may start past its backoff on a loaded machine."""

NOTIFIES = r"""
import os, socket, sys, time
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"READY=1", os.environ["NOTIFY_SOCKET"])
time.sleep(60)
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def shown(url: str, process_id: str) -> dict:
    ran = run_cli("show", process_id, "--json", url=url)
    assert ran.returncode == 0, ran.stderr
    document: dict = orjson.loads(ran.stdout)
    return document


def exists(url: str, process_id: str) -> bool:
    return run_cli("show", process_id, "--json", url=url).returncode == 0


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def own_supervisor(url: str, process_id: str, procs: Processes) -> None:
    """Know the detached supervisor by its recorded pid, so teardown can kill it."""
    owner = shown(url, process_id)["record"]["first_started"]["owner"]
    procs.add(owner["liveness"]["pid"])


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--ready-port", "0"], "--ready-port"),
        (["--ready-port", "70000"], "--ready-port"),
        (["--ready-output", "(unclosed"], "--ready-output"),
        (["--ready-file", "x", "--ready-timeout", "-1s"], "--ready-timeout"),
        (["--ready-file", "x", "--ready-timeout", "soon"], "--ready-timeout"),
        (["--restart", "sometimes"], "--restart"),
        (["--restart", "always", "--backoff-initial", "-0.2s"], "--backoff-initial"),
        (["--max-restarts", "3"], "--max-restarts"),
        (["--wait-ready", "--ready-file", "x"], "--wait-ready"),
    ],
)
def test_bad_input_is_one_usage_line_and_records_nothing(
    tmp_path: Path, flags: list[str], named: str
) -> None:
    url = f"sqlite:///{tmp_path}/never.db"
    ran = run_cli("run", *flags, "--", "true", url=url)
    assert ran.returncode == 2, (ran.stdout, ran.stderr)
    assert ran.stderr.count("\n") == 1, ran.stderr
    assert named in ran.stderr
    assert "Traceback" not in ran.stderr
    assert not (tmp_path / "never.db").exists()


def test_wait_with_a_bad_timeout_is_a_usage_error(ledger: str) -> None:
    ran = run_cli("wait", "x", "--timeout", "-5s", url=ledger)
    assert ran.returncode == 2, ran.stderr
    assert "--timeout" in ran.stderr


def test_ready_timeout_stops_the_tree_and_wait_says_not_ready(
    ledger: str, procs: Processes
) -> None:
    pidfile = procs.pidfile("never-ready")
    ran = run_cli(
        "run", "--background", "--wait-ready", "--ready-port", str(free_port()),
        "--ready-timeout", "1s", "--", *sleeper(pidfile), url=ledger,
    )  # fmt: skip
    assert ran.returncode == 1, (ran.stdout, ran.stderr)
    assert ran.stderr.count("\n") == 1
    assert "before it was ready" in ran.stderr
    (record,) = orjson.loads(run_cli("ps", "--all", "--json", url=ledger).stdout)["records"]
    assert (record["state"], record["reason"]) == ("failed", "ready_timeout")
    assert record["ready_at_ms"] is None
    # The tree was stopped before the terminal was recorded: the child is gone (or a zombie
    # its exiting supervisor has not reaped yet).
    child = record["os"]["pid"]
    assert int(pidfile.read_text()) == child
    wait_until(lambda: _gone(child), what="the tree to be stopped")
    waited = run_cli("wait", record["id"], "--until", "ready", "--timeout", "10s", url=ledger)
    assert waited.returncode == 1, waited.stderr


def test_a_foreground_run_that_is_never_ready_exits_1(ledger: str, procs: Processes) -> None:
    # Recorded `failed`: the SIGTERM that then stopped the tree is not how it ended (it exited
    # 143, as if someone had sent it; a failure exits 1).
    pidfile = procs.pidfile("never-ready-here")
    ran = run_cli(
        "run", "--ready-port", str(free_port()), "--ready-timeout", "1s", "--", *sleeper(pidfile),
        url=ledger,
    )  # fmt: skip
    assert ran.returncode == 1, ran.stderr
    (record,) = orjson.loads(run_cli("ps", "--all", "--json", url=ledger).stdout)["records"]
    assert (record["state"], record["reason"]) == ("failed", "ready_timeout")
    assert _gone(record["os"]["pid"])


def test_wait_ready_with_sd_notify_then_wait_and_timeout(ledger: str, procs: Processes) -> None:
    pidfile = procs.pidfile("notifier")
    command = [sys.executable, "-c", NOTIFIES, str(pidfile)]
    ran = run_cli(
        "run", "--background", "--wait-ready", "--ready-notify", "--json", "--", *command,
        url=ledger,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    record = orjson.loads(ran.stdout)
    own_supervisor(ledger, record["id"], procs)
    procs.await_pid(pidfile)
    assert record["ready_at_ms"] is not None
    assert record["readiness"]["notify"] is True
    assert run_cli("wait", record["id"], url=ledger).returncode == 0
    timed_out = run_cli("wait", record["id"], "--until", "exit", "--timeout", "0.3s", url=ledger)
    assert timed_out.returncode == 124, timed_out.stderr
    assert run_cli("stop", record["id"], "--mode", "kill", url=ledger).returncode == 0
    ended = run_cli("wait", record["id"], "--until", "exit", "--timeout", "30s", url=ledger)
    assert ended.returncode == 1  # killed: not a successful end


def test_stop_during_the_backoff_cancels_the_service(ledger: str, procs: Processes) -> None:
    ran = run_cli(
        "run", "--background", "--restart", "always", "--backoff-initial", "30s",
        "--backoff-max", "30s", "--", "sh", "-c", "exit 4", url=ledger,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    first = ran.stdout.strip()
    own_supervisor(ledger, first, procs)
    second = f"{first}.2"
    wait_until(lambda: exists(ledger, second), 30, "the second attempt to be registered")
    stopped = run_cli("stop", first, url=ledger)
    assert stopped.returncode == 0, stopped.stderr
    assert second in stopped.stdout
    ended = run_cli("wait", first, "--until", "exit", "--timeout", "30s", url=ledger)
    assert ended.returncode == 1, ended.stderr
    assert shown(ledger, second)["record"]["state"] == "terminated"
    assert not exists(ledger, f"{first}.3")
    rows = run_cli("ps", "--all", url=ledger).stdout.splitlines()
    assert len(rows) == 2
    assert rows[1].startswith(second)
    assert len(run_cli("ps", "--all", "--attempts", url=ledger).stdout.splitlines()) == 3


@pytest.mark.slow
def test_the_issues_crash_loop_in_the_foreground(ledger: str) -> None:
    """Initial backoff 0.2 s, max 1.6 s, 5 restarts per minute: attempts 0.2, 0.4, 0.8, 1.6,
    1.6 s apart (±15%), the sixth failure a crash_loop, and `show` lists six attempts."""
    ran = run_cli(
        "run", "--restart", "on-failure", "--backoff-initial", "0.2s", "--backoff-max", "1.6s",
        "--max-restarts", "5", "--restart-window", "1m", "--", "sh", "-c", "exit 3", url=ledger,
    )  # fmt: skip
    assert ran.returncode == 3, ran.stderr
    assert "crash_loop" in ran.stderr
    (row,) = orjson.loads(run_cli("ps", "--all", "--json", url=ledger).stdout)["records"]
    assert (row["attempt"], row["gave_up"]) == (6, "crash_loop")
    document = shown(ledger, row["id"])
    attempts = document["attempts"]
    assert [(a["attempt"], a["exit_code"]) for a in attempts] == [(n, 3) for n in range(1, 7)]
    gaps = [
        (after["started_at_ms"] - before["finished_at_ms"]) / 1000
        for before, after in itertools.pairwise(attempts)
    ]
    for gap, planned in zip(gaps, [0.2, 0.4, 0.8, 1.6, 1.6], strict=True):
        # Never early; late by a loaded machine's spawn and write at most (0.473 s for a
        # planned 0.4 was seen in CI), still far short of the next step's plan.
        assert planned * 0.85 <= gap <= planned * 1.15 + LATE_S, gaps
    assert [e["kind"] for e in document["events"]][-1] == "crash_loop"
    text = run_cli("show", row["id"], url=ledger).stdout
    assert text.count("exit 3") >= 6
    # A prefix of the service's id names the service, not an ambiguous set of attempts: `show`
    # of a service is its newest attempt (docs/notes-services-view.md).
    by_prefix = run_cli("show", row["attempt_of"][:12], "--json", url=ledger)
    assert by_prefix.returncode == 0, by_prefix.stderr
    assert orjson.loads(by_prefix.stdout)["record"]["id"] == row["id"]
