"""``procledger run`` end to end in a pseudo-terminal (docs/design.md §8): output streams through,
Ctrl-C stops the tree, a second Ctrl-C kills it (``--no-pty``: on the terminal relayed by
default, Ctrl-C is the command's terminal's, tests/cli/test_cli_pty_foreground.py),
``procledger stop`` from another process is carried out, exit codes follow how the command
ended, ``--json`` prints the final record."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import psutil
import pytest

from _shared import Processes, run_cli, wait_until
from procledger import ProcessState, TerminalReason, open_registry

from .conftest import Terminal, ignoring, sleeper, supervise_sleeper


def listed(url: str, *options: str) -> list[dict]:
    """``ps --json [OPTIONS]``'s records (it also says which records it could not read)."""
    ran = run_cli("ps", *options, "--json", url=url)
    assert ran.returncode == 0, ran.stderr
    found = orjson.loads(ran.stdout)
    assert found["damaged"] == []
    return found["records"]


def running_ids(url: str) -> list[str]:
    return [record["id"] for record in listed(url)]


def only_process(url: str) -> dict:
    (record,) = listed(url, "--all")
    return record


def test_output_streams_through_and_the_exit_code_is_the_commands(
    ledger: str, terminal: Callable[..., Terminal]
) -> None:
    term = terminal("--url", ledger, "run", "--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert term.wait() == 7
    term.expect(r"out\r?\n")
    term.expect(r"err\r?\n")
    record = only_process(ledger)
    assert (record["state"], record["exit_code"], record["status"]) == ("exited", 7, "failed")


def test_first_ctrl_c_interrupts_the_tree(
    ledger: str, terminal: Callable[..., Terminal], procs: Processes
) -> None:
    term, child = supervise_sleeper(terminal, procs, ledger, "--no-pty")
    term.ctrl_c()
    assert term.wait() == 130
    wait_until(lambda: not child.is_running() or child.status() == "zombie", what="child gone")
    record = only_process(ledger)
    assert (record["state"], record["reason"]) == ("interrupted", "interrupted")
    assert record["stop_requested"] == ["interrupted"]
    assert record["status"] == "cancelled"


def test_first_ctrl_c_escalates_to_the_stop_signal_then_sigkill(
    ledger: str, terminal: Callable[..., Terminal], procs: Processes
) -> None:
    term_ignorer = procs.pidfile("ignores-int")
    term = terminal(
        "--url",
        ledger,
        "run",
        "--no-pty",
        "--grace",
        "0.3",
        "--",
        *ignoring(term_ignorer, "SIGINT"),
    )
    term.expect("ready")
    procs.await_pid(term_ignorer)
    term.ctrl_c()
    assert term.wait() == 130
    record = only_process(ledger)
    assert (record["state"], record["reason"]) == ("terminated", "terminated")  # SIGTERM did it

    stubborn = procs.pidfile("ignores-int-and-term")
    term = terminal(
        "--url",
        ledger,
        "run",
        "--no-pty",
        "--grace",
        "0.3",
        "--stop-signal",
        "USR2",
        "--",
        *ignoring(stubborn, "SIGINT", "SIGTERM", "SIGUSR2"),
    )
    term.expect("ready")
    procs.await_pid(stubborn)
    started = time.monotonic()
    term.ctrl_c()
    assert term.wait() == 130
    assert time.monotonic() - started >= 0.5  # two graces before the SIGKILL
    killed = [r for r in listed(ledger, "--all") if r["state"] == "killed"]
    assert [(r["reason"], r["stop_requested"]) for r in killed] == [("killed", ["interrupted"])]


def test_second_ctrl_c_kills_at_once(
    ledger: str, terminal: Callable[..., Terminal], procs: Processes
) -> None:
    ready = procs.pidfile("ignores-everything")
    term = terminal(
        "--url",
        ledger,
        "run",
        "--no-pty",
        "--grace",
        "60",
        "--",
        *ignoring(ready, "SIGINT", "SIGTERM"),
    )
    term.expect("ready")
    child = procs.await_pid(ready)
    term.ctrl_c()
    wait_until(
        lambda: only_process(ledger)["stop_requested"] == ["interrupted"],
        what="the first Ctrl-C to be recorded",
    )
    assert child.is_running()  # it ignores SIGINT, and the grace is a minute
    started = time.monotonic()
    term.ctrl_c()
    assert term.wait() == 130
    assert time.monotonic() - started < 30  # well inside the minute of grace
    record = only_process(ledger)
    assert (record["state"], record["reason"]) == ("killed", "killed")
    assert record["stop_requested"] == ["interrupted", "killed"]


@pytest.mark.parametrize("mode", ["interrupt", "terminate", "kill"])
def test_stop_from_another_process_is_carried_out(
    ledger: str, terminal: Callable[..., Terminal], procs: Processes, mode: str
) -> None:
    term, _ = supervise_sleeper(terminal, procs, ledger)
    (process_id,) = running_ids(ledger)
    stopped = run_cli("stop", process_id, "--mode", mode, url=ledger)
    assert stopped.returncode == 0, stopped.stderr
    assert process_id in stopped.stdout
    assert term.wait() == 130
    record = only_process(ledger)
    reason = {"interrupt": "interrupted", "terminate": "terminated", "kill": "killed"}[mode]
    assert record["stop_requested"] == [reason]
    assert record["state"] == reason
    assert record["status"] == "cancelled"


def test_an_unrequested_signal_exits_128_plus_its_number(
    ledger: str, terminal: Callable[..., Terminal]
) -> None:
    term = terminal("--url", ledger, "run", "--", "sh", "-c", "kill -TERM $$")
    assert term.wait() == 128 + signal.SIGTERM
    record = only_process(ledger)
    assert (record["state"], record["stop_requested"]) == ("signaled", [])
    assert (record["signal"], record["status"], record["exit_code"]) == (15, "failed", None)


def test_json_prints_the_final_record_on_stdout(ledger: str) -> None:
    ran = run_cli("run", "--json", "--", "sh", "-c", "echo from-the-child", url=ledger)
    assert ran.returncode == 0, ran.stderr
    record = orjson.loads(ran.stdout)  # stdout is the record alone
    assert (record["state"], record["exit_code"], record["status"]) == ("exited", 0, "completed")
    assert record["input"]["argv"] == ["sh", "-c", "echo from-the-child"]
    assert "from-the-child" in ran.stderr  # the command's stdout went to stderr


def test_spawn_failure_is_one_line_and_recorded(ledger: str) -> None:
    ran = run_cli("run", "--", "/no/such/program", url=ledger)
    assert ran.returncode == 127  # as a shell says "command not found"
    assert ran.stderr.count("\n") == 1
    assert (
        ran.stderr == "procledger run: cannot run '/no/such/program': no such file or directory\n"
    )
    assert "Traceback" not in ran.stderr
    record = only_process(ledger)
    assert (record["state"], record["reason"]) == ("failed", "failed")


def test_background_returns_once_running_and_stops_on_request(
    ledger: str, procs: Processes, tmp_path: Path
) -> None:
    pidfile = procs.pidfile("background")
    ran = run_cli("run", "--background", "--json", "--", *sleeper(pidfile), url=ledger)
    assert ran.returncode == 0, ran.stderr
    record = orjson.loads(ran.stdout)
    assert (record["state"], record["backgrounded"]) == ("running", True)
    supervisor_pid = record["first_started"]["owner"]["liveness"]["pid"]
    procs.add(supervisor_pid)  # the detached procledger that supervises it
    procs.await_pid(pidfile)
    registry = open_registry(ledger)
    try:
        events = [event.kind for event in registry.events(record["id"])]
        assert "backgrounded" in events
        assert "started" not in events
        assert run_cli("stop", record["id"], "--mode", "kill", url=ledger).returncode == 0
        final = registry.await_terminal(record["id"], timeout=30)
    finally:
        registry.close()
    assert (final.state, final.reason) == (ProcessState.killed, TerminalReason.killed)


def test_the_store_url_is_not_on_the_agent_s_command_line(
    ledger: str, procs: Processes, tmp_path: Path
) -> None:
    # Every user can read a command line; a PostgreSQL URL holds a password. The agent gets
    # the URL in its environment, and the command's environment is the one `run` had.
    seen = tmp_path / "environment"
    command = ["sh", "-c", f'env > "{seen}.tmp" && mv "{seen}.tmp" "{seen}" && exec sleep 60']
    ran = run_cli("run", "--background", "--json", "--", *command, url=ledger)
    assert ran.returncode == 0, ran.stderr
    record = orjson.loads(ran.stdout)
    agent = psutil.Process(record["first_started"]["owner"]["liveness"]["pid"])
    procs.add(record["os_pid"])
    assert not [arg for arg in agent.cmdline() if "ledger.db" in arg or arg == "--url"]
    wait_until(seen.exists, 30, "the command's environment")
    environment = seen.read_text()
    assert "PROCLEDGER_DETACHED_URL" not in environment
    assert "ledger.db" not in environment
    assert run_cli("stop", record["id"], "--mode", "kill", url=ledger).returncode == 0


def test_run_usage_errors_exit_2(ledger: str) -> None:
    assert run_cli("run", url=ledger).returncode == 2
    bad_signal = run_cli("run", "--stop-signal", "NOPE", "--", "true", url=ledger)
    assert bad_signal.returncode == 2
    assert "NOPE" in bad_signal.stderr


def test_command_options_after_the_separator_belong_to_the_command(ledger: str) -> None:
    ran = run_cli("run", "--json", "--", sys.executable, "-c", "print('x')", "--json", url=ledger)
    assert ran.returncode == 0, ran.stderr
    assert orjson.loads(ran.stdout)["input"]["argv"][-1] == "--json"


def test_sigterm_to_run_shuts_the_supervisor_down(
    ledger: str, terminal: Callable[..., Terminal], procs: Processes
) -> None:
    term, _ = supervise_sleeper(terminal, procs, ledger, "--grace", "5")
    term.process.send_signal(signal.SIGTERM)
    assert term.wait() == 128 + signal.SIGTERM
    record = only_process(ledger)
    assert (record["state"], record["reason"]) == ("terminated", "runner_shutdown")
    assert record["status"] == "cancelled"
