"""How a run that never got ready says so (docs/design.md §8, §15): the state *and why* --
``failed/ready_timeout``, ``exited (exit 3)`` -- on stderr whether or not it is a terminal; and
Ctrl-C while `run --background --wait-ready` waits leaves the process starting under the host
agent, prints its id and says how to stop it (exit 130) -- as does Ctrl-C before the agent
answered `run --background` at all.

Every child writes its pid to a file the test names (``procs`` kills it by exact pid); the host
agents are killed by exact pid at each test's end (``tests/conftest.py``).
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import orjson

from _shared import CLI, Processes, child_env, end_process, run_cli, wait_until
from procledger.agent.control_client import socket_path
from procledger.agent.launch import ledger_key

from .conftest import Terminal, sleeper


def only_record(url: str) -> dict:
    (record,) = orjson.loads(run_cli("ps", "--all", "--json", url=url).stdout)["records"]
    return record


def test_a_ready_timeout_is_said_on_stderr_into_a_pipe(
    ledger: str, procs: Processes, tmp_path: Path
) -> None:
    never = tmp_path / "never-there"
    pidfile = procs.pidfile("never-ready")
    ran = run_cli(
        "run", "--ready-file", str(never), "--ready-timeout", "0.5s", "--", *sleeper(pidfile),
        url=ledger,
    )  # fmt: skip
    assert ran.returncode == 1, ran.stderr
    record = only_record(ledger)
    assert ran.stderr == (
        f"procledger: process {record['id']} failed/ready_timeout: not ready within 0.5 s: "
        f"file:{never} did not hold\n"
    )
    with_json = run_cli(
        "run", "--json", "--ready-file", str(never), "--ready-timeout", "0.5s", "--",
        *sleeper(procs.pidfile("never-ready-json")), url=ledger,
    )  # fmt: skip
    assert with_json.returncode == 1
    assert orjson.loads(with_json.stdout)["reason"] == "ready_timeout"  # stdout: the record
    # stderr: the child's output ("ready"), then the line saying how it ended.
    assert with_json.stderr.splitlines()[-2:] == [
        "ready",
        f"procledger: process {orjson.loads(with_json.stdout)['id']} failed/ready_timeout: "
        f"not ready within 0.5 s: file:{never} did not hold",
    ]


def test_a_ready_timeout_is_said_on_a_terminal_too(
    ledger: str, terminal: Callable[..., Terminal], procs: Processes, tmp_path: Path
) -> None:
    pidfile = procs.pidfile("never-ready-tty")
    term = terminal(
        "--url", ledger, "run", "--ready-file", str(tmp_path / "never-there"),
        "--ready-timeout", "0.5s", "--", *sleeper(pidfile),
    )  # fmt: skip
    assert term.wait() == 1
    term.expect(r"procledger: process \S+ failed/ready_timeout: not ready within 0\.5 s")


def test_wait_ready_names_why_it_ended_before_it_was_ready(
    ledger: str, procs: Processes, tmp_path: Path
) -> None:
    never = str(tmp_path / "never-there")
    exited = run_cli(
        "run", "--background", "--wait-ready", "--ready-file", never, "--",
        "sh", "-c", "exit 3", url=ledger,
    )  # fmt: skip
    assert exited.returncode == 1, exited.stderr
    assert exited.stdout == ""
    first = only_record(ledger)["id"]
    assert exited.stderr == (
        f"procledger run: process {first} ended before it was ready: exited (exit 3)\n"
    )
    timed_out = run_cli(
        "run", "--background", "--wait-ready", "--ready-file", never, "--ready-timeout", "0.5s",
        "--", *sleeper(procs.pidfile("never-ready-background")), url=ledger,
    )  # fmt: skip
    assert timed_out.returncode == 1, timed_out.stderr
    assert timed_out.stderr.count("\n") == 1
    assert "ended before it was ready: failed/ready_timeout: not ready within 0.5 s" in (
        timed_out.stderr
    )


def waits_on(pid: int, ledger_file: Path) -> bool:
    """Whether process ``pid`` has the ledger open: `run --wait-ready` does only once the agent
    answered that the command runs, to wait for it to be ready."""
    folder = Path(f"/proc/{pid}/fd")
    for fd in folder.iterdir():
        try:
            if Path(os.readlink(fd)) == ledger_file:
                return True
        except OSError:  # closed meanwhile
            continue
    return False


def test_ctrl_c_while_waiting_leaves_it_starting_and_prints_its_id(
    tmp_path: Path, procs: Processes
) -> None:
    ledger_file = tmp_path / "ledger.db"
    url = f"sqlite:///{ledger_file}"
    pidfile = procs.pidfile("starting")
    waiting = subprocess.Popen(
        [*CLI, "--url", url, "run", "--background", "--wait-ready", "--ready-file",
         str(tmp_path / "never-there"), "--", *sleeper(pidfile)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(), text=True,
        start_new_session=True,
    )  # fmt: skip
    procs.add(waiting.pid)
    try:
        child = procs.await_pid(pidfile)
        wait_until(lambda: waits_on(waiting.pid, ledger_file), what="run to wait for readiness")
        os.kill(waiting.pid, signal.SIGINT)  # what Ctrl-C sends it
        out, err = waiting.communicate(timeout=60)
    finally:
        end_process(waiting)
    assert waiting.returncode == 130, err
    process_id = out.strip()
    assert out == f"{process_id}\n"
    assert err == (
        f"procledger run: interrupted while waiting for process {process_id} to be ready: it "
        f"keeps starting under the host agent (procledger stop {process_id} stops it)\n"
    )
    record = orjson.loads(run_cli("show", process_id, "--json", url=url).stdout)["record"]
    assert (record["state"], record["os"]["pid"]) == ("running", child.pid)
    assert child.is_running()
    stopped = run_cli("stop", process_id, "--mode", "kill", url=url)
    assert stopped.returncode == 0, stopped.stderr
    ended = run_cli("wait", process_id, "--until", "exit", "--timeout", "30s", url=url)
    assert ended.returncode == 1, ended.stderr


class UnansweringAgent:
    """A stand-in for a ledger's host agent on its control socket: it answers ``ping`` (so
    `run --background` finds an agent running) and takes a ``start`` order without ever
    answering it -- an agent whose start rides through a database restart, say."""

    def __init__(self, path: str) -> None:
        self._listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listening.bind(path)
        self._listening.listen()
        self._held: list[socket.socket] = []
        self.orders: queue.Queue[dict] = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name="test-fake-agent")
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._listening.accept()
            except OSError:  # shut down: the test is over
                return
            with connection.makefile("rb") as lines:
                order = orjson.loads(lines.readline())
            if order["op"] == "start":
                self._held.append(connection)  # taken, never answered
                self.orders.put(order)
            else:
                connection.sendall(b'{"ok": true, "result": {}}\n')
                connection.close()

    def close(self) -> None:
        self._listening.shutdown(socket.SHUT_RDWR)  # wakes the accept
        self._thread.join(30)
        self._listening.close()
        for connection in self._held:
            connection.close()


def test_ctrl_c_before_the_agent_answers_prints_the_id_it_was_given(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    agent = UnansweringAgent(socket_path(ledger_key(url)))
    try:
        starting = subprocess.Popen(
            [*CLI, "--url", url, "run", "--background", "--", "true"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(), text=True,
            start_new_session=True,
        )  # fmt: skip
        try:
            order = agent.orders.get(timeout=60)  # the order reached the agent, unanswered
            os.kill(starting.pid, signal.SIGINT)
            out, err = starting.communicate(timeout=60)
        finally:
            end_process(starting)
    finally:
        agent.close()
    process_id = order["process_id"]
    assert (starting.returncode, out) == (130, f"{process_id}\n")
    assert err == (
        f"procledger run: interrupted before the host agent answered: process {process_id} may "
        f"be starting under it (procledger show {process_id} says; procledger stop {process_id} "
        "stops it)\n"
    )
