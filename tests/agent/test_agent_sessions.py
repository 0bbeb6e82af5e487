"""Background sessions on a real pseudo-terminal or stdin pipe, held by a real agent
(docs/design.md §20.2): `send` journalled and applied once, a password redacted, `attach` and
detach leaving the session running, and what survives the agent killed mid-session.

Every child is cleaned up by exact pid: the agent's tree by the autouse fixture, and each
session's child through ``procs`` (it may outlive the agent that started it).
"""

from __future__ import annotations

import base64
import os
import signal
import sys
from pathlib import Path

import orjson
import pexpect
import pytest

from _shared import CLI, Processes, child_env, wait_until
from procledger import WaitKind

from .live_agent import DEADLINE, LiveAgent

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the agent is Linux only")


@pytest.fixture
def agent(tmp_path: Path) -> LiveAgent:
    agent = LiveAgent(f"sqlite:///{tmp_path}/ledger.db")
    agent.start()
    return agent


def start(agent: LiveAgent, procs: Processes, *argv: str, stdin: str | None = None) -> str:
    """``run --background --pty`` (or ``--stdin pipe``): the id; its child recorded for
    cleanup by its exact pid."""
    how = ("--stdin", stdin) if stdin else ("--pty",)
    ran = agent.cli("run", "--background", *how, "--", *argv)
    assert ran.returncode == 0, ran.stderr
    process_id = ran.stdout.strip()
    record = agent.record(process_id)
    assert record.os_pid is not None
    procs.add(record.os_pid)
    return process_id


def send(agent: LiveAgent, process_id: str, *args: str) -> dict[str, object]:
    ran = agent.cli("send", process_id, *args, "--json")
    assert ran.returncode == 0, ran.stderr
    answer: dict[str, object] = orjson.loads(ran.stdout)
    return answer


def logs_hold(agent: LiveAgent, process_id: str, text: str) -> bool:
    return text in agent.logs(process_id)


def input_events(agent: LiveAgent, process_id: str) -> list[dict[str, object]]:
    with agent.ledger() as registry:
        return [e.payload for e in registry.events(process_id) if e.kind == "input_sent"]


def test_a_background_repl_answers_a_send_and_a_retried_send_is_applied_once(
    agent: LiveAgent, procs: Processes
) -> None:
    process_id = start(agent, procs, sys.executable, "-q", "-i")
    wait_until(lambda: logs_hold(agent, process_id, ">>> "), DEADLINE, "the REPL's prompt")
    first = send(agent, process_id, "print(6*7)", "--line", "--command-id", "c-42")
    again = send(agent, process_id, "print(6*7)", "--line", "--command-id", "c-42")
    assert (first["applied"], again["applied"]) == (True, False)
    wait_until(lambda: logs_hold(agent, process_id, "42"), DEADLINE, "42")
    send(agent, process_id, "print('done')", "--line")
    wait_until(lambda: logs_hold(agent, process_id, "done"), DEADLINE, "done")
    assert agent.logs(process_id).count("\n42\n") == 1  # (text mode: \r\n read as \n)
    sent = input_events(agent, process_id)
    assert next(e["command_id"] for e in sent) == "c-42"
    assert base64.b64decode(str(sent[0]["data"])) == b"print(6*7)\n"
    send(agent, process_id, "--eof")
    record = agent.await_terminal(process_id)
    assert (record.state.value, record.exit_code, record.pty) == ("exited", 0, True)


def test_a_password_prompt_s_answer_is_redacted_in_the_ledger_and_never_echoed(
    agent: LiveAgent, procs: Processes
) -> None:
    script = 'read -s -p "Password: " p; echo; echo "got ${#p}"'
    process_id = start(agent, procs, "bash", "-c", script)
    wait_until(lambda: logs_hold(agent, process_id, "Password: "), DEADLINE, "the prompt")
    wait_until(lambda: _echo_off(agent, process_id), DEADLINE, "read -s to turn echo off")
    waiting = wait_until(lambda: agent.record(process_id).waiting_for_input, DEADLINE, "a wait")
    assert (waiting.kind, waiting.last_line) == ("password", "Password: ")
    assert "waiting for input (password)" in agent.cli("ps").stdout
    with agent.ledger() as registry:  # the process's loop was told, journalled first
        told = [e.notification for e in registry.journal_entries()]
    assert [getattr(n, "kind", None) for n in told] == [WaitKind.password]
    send(agent, process_id, "hunter2", "--line")
    record = agent.await_terminal(process_id)
    assert record.exit_code == 0
    output = agent.logs(process_id)
    assert "got 7" in output
    assert "hunter2" not in output
    assert agent.record(process_id).waiting_for_input is None
    (event,) = input_events(agent, process_id)
    assert (event["data"], event["redacted"], event["size"]) == (None, True, 8)
    shown = agent.cli("show", process_id)
    assert "hunter2" not in shown.stdout
    assert "data=redacted" in shown.stdout


def _echo_off(agent: LiveAgent, process_id: str) -> bool:
    """Whether the child's terminal has echo off (bash's ``read -s`` turns it off after it
    printed the prompt): read through the child's own stdin, /proc/<pid>/fd/0."""
    import termios

    pid = agent.record(process_id).os_pid
    fd = os.open(f"/proc/{pid}/fd/0", os.O_RDONLY | os.O_NOCTTY)
    try:
        return not termios.tcgetattr(fd)[3] & termios.ECHO
    finally:
        os.close(fd)


def test_send_to_a_stdin_pipe_and_eof_ends_it(agent: LiveAgent, procs: Processes) -> None:
    process_id = start(agent, procs, "cat", stdin="pipe")
    send(agent, process_id, "hello", "--line")
    wait_until(lambda: logs_hold(agent, process_id, "hello\n"), DEADLINE, "cat's echo")
    send(agent, process_id, "--eof")
    record = agent.await_terminal(process_id)
    assert (record.state.value, record.exit_code) == ("exited", 0)
    assert [e["eof"] for e in input_events(agent, process_id)] == [False, True]


def test_send_refuses_a_process_that_takes_no_input_and_records_nothing(
    agent: LiveAgent, procs: Processes, tmp_path: Path
) -> None:
    ran = agent.run_background("sleep", "300")
    process_id = ran.stdout.strip()
    procs.add(agent.record(process_id).os_pid or 0)
    refused = agent.cli("send", process_id, "hi")
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1
    assert "takes no input" in refused.stderr
    assert input_events(agent, process_id) == []
    usage = agent.cli("send", process_id)
    assert usage.returncode == 2
    assert "nothing to send" in usage.stderr


def test_attach_then_detach_leaves_the_session_running(agent: LiveAgent, procs: Processes) -> None:
    process_id = start(agent, procs, sys.executable, "-q", "-i")
    wait_until(lambda: logs_hold(agent, process_id, ">>> "), DEADLINE, "the REPL's prompt")
    argv = [*CLI, "--url", agent.url, "attach", process_id]
    env = child_env()
    env.pop("PROCLEDGER_URL", None)
    attached = pexpect.spawn(argv[0], argv[1:], env=env, timeout=DEADLINE, dimensions=(30, 100))
    procs.add(attached.pid)
    try:
        attached.expect_exact(">>> ")
        attached.send("print(2+3*4)\r")
        attached.expect_exact("14")
        attached.send("\x10\x11")  # Ctrl-P, Ctrl-Q
        attached.expect_exact(f"[detached from {process_id}]")
        attached.expect(pexpect.EOF)
    finally:
        attached.close(force=True)
    assert attached.exitstatus == 0
    assert agent.record(process_id).state.value == "running"
    send(agent, process_id, "print(6*7)", "--line")
    wait_until(lambda: logs_hold(agent, process_id, "42"), DEADLINE, "42 after the detach")


def test_a_session_survives_its_agent_killed_and_takes_input_from_the_next(
    agent: LiveAgent, procs: Processes
) -> None:
    """The anchor keeps the terminal's master: the child gets no SIGHUP, what it writes while
    no agent runs waits in the terminal, and the next agent relays it and takes `send`s."""
    process_id = start(agent, procs, sys.executable, "-q", "-i")
    wait_until(lambda: logs_hold(agent, process_id, ">>> "), DEADLINE, "the REPL's prompt")
    send(agent, process_id, "import time; time.sleep(1); print('while-dead')", "--line")
    for _ in range(3):
        old = agent.await_serving()
        agent.kill(int(old["pid"]))
        agent.await_serving(other_than=int(old["pid"]))
    wait_until(lambda: logs_hold(agent, process_id, "while-dead"), DEADLINE, "the relay again")
    send(agent, process_id, "print(6*7)", "--line")
    wait_until(lambda: logs_hold(agent, process_id, "42"), DEADLINE, "42 from the next agent")
    assert agent.record(process_id).state.value == "running"
    send(agent, process_id, "--eof")
    record = agent.await_terminal(process_id)
    assert (record.state.value, record.exit_code) == ("exited", 0)


def test_a_stdin_pipe_session_survives_its_agent_killed(agent: LiveAgent, procs: Processes) -> None:
    process_id = start(agent, procs, "cat", stdin="pipe")
    old = agent.await_serving()
    agent.kill(int(old["pid"]))
    agent.await_serving(other_than=int(old["pid"]))
    send(agent, process_id, "after", "--line")
    wait_until(lambda: logs_hold(agent, process_id, "after\n"), DEADLINE, "cat's echo")
    send(agent, process_id, "--eof")
    assert agent.await_terminal(process_id).exit_code == 0


def test_a_session_whose_anchor_and_agent_are_killed_hangs_up_and_says_so(
    agent: LiveAgent, procs: Processes
) -> None:
    """With both gone nobody holds the terminal: the child gets SIGHUP (as when a terminal
    window closes), and the next agent records it ended unseen, its status unknown."""
    process_id = start(agent, procs, "sleep", "300")
    pid = agent.record(process_id).os_pid
    status = agent.await_serving()
    os.kill(int(status["anchor_pid"]), signal.SIGKILL)
    agent.kill(int(status["pid"]))
    wait_until(lambda: not _alive(pid or 0), DEADLINE, "the child to hang up")
    agent.start()
    record = agent.await_terminal(process_id)
    assert record.state.value == "lost_on_restore"
    assert "unknown" in (record.diagnostic or "")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
