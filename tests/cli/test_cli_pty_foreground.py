"""``procledger run`` on a real terminal (docs/design.md §20.1): the command gets a
pseudo-terminal procledger relays, so a REPL, a pager and a password prompt work as without
procledger; Ctrl-C, Ctrl-Z and resizes reach it; our terminal is given back as it was; the
ledger records how it ended and keeps its one merged stream as stdout. Driven with pexpect,
which runs ``procledger`` on a pseudo-terminal of its own, as a person's terminal is."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import termios
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pexpect
import psutil
import pytest

from _shared import Processes, child_env, is_dead, run_cli, wait_until
from procledger.cli.parsing import parse
from procledger.cli.run_options import RunOptions
from procledger.cli.table import RUN

from .test_cli_run import listed, only_process

TIMEOUT_S = 30

Spawn = Callable[..., pexpect.spawn]


def quiet_env(**overrides: str) -> dict[str, str]:
    """The child's environment, seeing only the store the test names (``--url``)."""
    env = child_env(TERM="xterm", **overrides)
    env.pop("PROCLEDGER_URL", None)
    return env


@pytest.fixture
def spawn(procs: Processes, tmp_path: Path) -> Iterator[Spawn]:
    """``spawn(program, *args)``: a program on a pseudo-terminal of pexpect's, its pid known to
    ``procs``; everything it writes is kept in ``.transcript``."""
    spawned: list[pexpect.spawn] = []

    def start(program: str, *args: str, env: dict[str, str] | None = None) -> pexpect.spawn:
        child = pexpect.spawn(
            program,
            list(args),
            env=env or quiet_env(),
            cwd=tmp_path,
            timeout=TIMEOUT_S,
            dimensions=(24, 80),
            encoding="utf-8",
            codec_errors="replace",
        )
        child.transcript = io.StringIO()
        child.logfile_read = child.transcript
        procs.add(child.pid)
        spawned.append(child)
        return child

    yield start
    procs.kill_all()
    for child in spawned:
        child.close(force=True)


def run_in_terminal(spawn: Spawn, ledger: str, *args: str) -> pexpect.spawn:
    """``procledger --url LEDGER run ARGS...`` on a terminal."""
    return spawn(sys.executable, "-m", "procledger", "--url", ledger, "run", *args)


def supervised_child(ledger: str, procs: Processes) -> psutil.Process:
    """The command ``run`` supervises, once it runs (known to ``procs``)."""

    def running() -> dict | None:
        if not Path(ledger.removeprefix("sqlite:///")).exists():
            return None  # not created yet
        return next((r for r in listed(ledger, "--all") if r.get("os_pid")), None)

    record = wait_until(running, TIMEOUT_S, "the command to be recorded running")
    return procs.add(record["os_pid"])


def ended(child: pexpect.spawn) -> int:
    """The exit status of ``procledger`` (128 + N when signal N ended it)."""
    child.expect(pexpect.EOF)
    child.wait()
    if child.signalstatus is not None:
        return int(128 + child.signalstatus)
    return int(child.exitstatus)


def lflags(child: pexpect.spawn) -> int:
    """The local modes of ``procledger``'s terminal (read through pexpect's master)."""
    return int(termios.tcgetattr(child.child_fd)[3])


def test_a_repl_round_trip_on_a_terminal_is_recorded_as_one_stream(
    spawn: Spawn, ledger: str
) -> None:
    child = run_in_terminal(spawn, ledger, "--", "python3", "-q", "-i")
    child.expect_exact(">>> ")
    child.sendline("print(6*7)")
    child.expect(r"\r\n42\r\n")
    child.expect_exact(">>> ")
    child.sendcontrol("d")
    assert ended(child) == 0
    record = only_process(ledger)
    assert (record["state"], record["exit_code"], record["pty"]) == ("exited", 0, True)
    kept = run_cli("logs", record["id"], "--json", url=ledger)
    chunks = [orjson.loads(line) for line in kept.stdout.splitlines()]
    assert {chunk["stream"] for chunk in chunks} == {"stdout"}  # one merged stream
    assert "print(6*7)\r\n42\r\n" in "".join(chunk["data"] for chunk in chunks)


def test_the_command_s_stdin_and_stdout_are_terminals(spawn: Spawn, ledger: str) -> None:
    script = "test -t 0 && test -t 1 && test -t 2 && echo TTY-$(tty | cut -c1-8)"
    child = run_in_terminal(spawn, ledger, "--", "sh", "-c", script)
    child.expect("TTY-/dev/pts")
    assert ended(child) == 0


def test_a_pager_quits_cleanly_and_our_terminal_is_given_back(
    spawn: Spawn, ledger: str, tmp_path: Path
) -> None:
    text = tmp_path / "long.txt"
    text.write_text("".join(f"line number {n}\n" for n in range(1, 500)))
    before = lflags(spawn("sleep", "0"))  # a fresh terminal's modes, as pexpect makes them
    child = run_in_terminal(spawn, ledger, "--", "less", str(text))
    child.expect("line number 20")
    assert not lflags(child) & (termios.ICANON | termios.ECHO)  # ours is raw while it runs
    child.send("q")
    assert ended(child) == 0
    after = lflags(child)
    assert after & (termios.ICANON | termios.ECHO | termios.ISIG) == termios.ICANON | (
        termios.ECHO | termios.ISIG
    )
    assert after == before
    assert only_process(ledger)["state"] == "exited"


def test_ctrl_c_reaches_the_command_through_its_terminal(
    spawn: Spawn, ledger: str, procs: Processes
) -> None:
    program = "import time; print('ready', flush=True); time.sleep(60)"
    child = run_in_terminal(spawn, ledger, "--", "python3", "-c", program)
    child.expect("ready")
    supervised_child(ledger, procs)
    child.sendcontrol("c")
    assert ended(child) == 130
    record = only_process(ledger)
    # The terminal signalled the command itself, as it would without procledger: nobody asked
    # procledger to stop it, so the ledger says SIGINT ended it, not that a stop was requested.
    assert (record["state"], record["signal"], record["stop_requested"]) == ("signaled", 2, [])
    assert "KeyboardInterrupt" in child.transcript.getvalue()


RESIZE = """
import os, signal, sys
def show(*_):
    size = os.get_terminal_size(0)
    print(f"size {size.lines}x{size.columns}", flush=True)
signal.signal(signal.SIGWINCH, show)
show()
while True:
    signal.pause()
"""


def test_a_resize_reaches_the_command(spawn: Spawn, ledger: str) -> None:
    child = run_in_terminal(spawn, ledger, "--", "python3", "-c", RESIZE)
    child.expect("size 24x80")
    child.setwinsize(40, 100)
    child.expect("size 40x100")
    child.setwinsize(30, 132)
    child.expect("size 30x132")
    child.sendcontrol("c")
    assert ended(child) == 130


def test_a_password_prompt_reads_what_is_typed_and_nothing_echoes_it(
    spawn: Spawn, ledger: str
) -> None:
    script = 'read -s -p "Password: " p; echo; echo "got ${#p}"'
    child = run_in_terminal(spawn, ledger, "--", "bash", "-c", script)
    child.expect_exact("Password: ")
    child.send("hunter2\r")
    child.expect("got 7")
    assert ended(child) == 0
    assert "hunter2" not in child.transcript.getvalue()
    record = only_process(ledger)
    kept = run_cli("logs", record["id"], url=ledger)
    assert "got 7" in kept.stdout
    assert "hunter2" not in kept.stdout
    shown = orjson.loads(run_cli("show", record["id"], "--json", url=ledger).stdout)
    assert "input_sent" not in [event["kind"] for event in shown["events"]]  # keys: no sends


def test_no_pty_keeps_the_pipe(spawn: Spawn, ledger: str) -> None:
    script = 'test -t 0 && echo "IN=tty" || echo "IN=pipe"; read line; echo "got <$line>"'
    child = run_in_terminal(spawn, ledger, "--no-pty", "--", "sh", "-c", script)
    child.expect("IN=pipe")
    child.sendline("typed words")
    child.expect("got <typed words>")
    assert ended(child) == 0
    assert only_process(ledger).get("pty") is None


def test_without_a_terminal_it_is_a_pipe_unless_pty_is_asked_for(ledger: str) -> None:
    script = 'test -t 0 && echo "IN=tty" || echo "IN=pipe"'
    assert run_cli("run", "--", "sh", "-c", script, url=ledger).stdout == "IN=pipe\n"
    forced = run_with_input(b"", "--url", ledger, "run", "--pty", "--", "sh", "-c", script)
    assert (forced.returncode, forced.stdout) == (0, b"IN=tty\r\n"), forced.stderr


def test_pty_with_piped_input_ends_it_with_the_terminal_s_end_of_input(ledger: str) -> None:
    ran = run_with_input(b"abc\n", "--url", ledger, "run", "--pty", "--", "cat")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.count(b"abc\r\n") == 2  # the terminal's echo, then cat's copy


def run_with_input(data: bytes, *args: str) -> subprocess.CompletedProcess[bytes]:
    """``procledger ARGS...`` reading ``data`` from a pipe, its output as bytes."""
    return subprocess.run(
        [sys.executable, "-m", "procledger", *args],
        input=data,
        capture_output=True,
        env=quiet_env(),
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    "options",
    [("--pty", "--no-pty"), ("--pty", "--stdin", "null")],
)
def test_pty_refuses_what_contradicts_it(ledger: str, options: tuple[str, ...]) -> None:
    ran = run_cli("run", *options, "--", "true", url=ledger)
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.startswith("procledger run: invalid value for --pty: not with --")


def test_ctrl_z_stops_the_job_and_fg_continues_it(
    spawn: Spawn, ledger: str, procs: Processes
) -> None:
    shell = spawn("bash", "--norc", "--noprofile", "-i", env=quiet_env(PS1="$ "))
    shell.expect_exact("$ ")
    shell.sendline(f"{sys.executable} -m procledger --url {ledger} run -- sleep 60")
    sleeper = supervised_child(ledger, procs)
    runner = procs.add(sleeper.ppid())  # procledger itself: the sleeper's parent
    # Until the run has started, Ctrl-C and Ctrl-Z are procledger's own (its terminal keeps
    # ISIG); from then on they are bytes for the sleeper's terminal.
    wait_until(lambda: not lflags(shell) & termios.ISIG, TIMEOUT_S, "the keys to be relayed")
    shell.sendcontrol("z")
    shell.expect("Stopped")
    shell.expect_exact("$ ")
    assert (runner.status(), sleeper.status()) == ("stopped", "stopped")
    shell.sendline("echo shell-$((6 * 7))")  # typed to, and run by, the shell
    shell.expect("shell-42")
    shell.expect_exact("$ ")
    shell.sendline("fg")
    wait_until(lambda: sleeper.status() != "stopped", TIMEOUT_S, "the sleeper to continue")
    assert runner.status() != "stopped"
    shell.sendcontrol("c")
    shell.expect_exact("$ ")
    shell.sendline("echo status=$?")
    shell.expect("status=130")
    record = only_process(ledger)
    assert (record["state"], record["signal"]) == ("signaled", 2)


def test_a_killed_run_hangs_up_its_command_s_terminal(
    spawn: Spawn, ledger: str, procs: Processes
) -> None:
    # procledger holds the command's terminal: once it is gone (SIGKILL: nothing of it runs
    # on), the kernel hangs the terminal up and sends the command SIGHUP, as closing a terminal
    # window does. `restore` then finds it gone (with --no-pty it would have run on).
    child = run_in_terminal(spawn, ledger, "--", "sh", "-c", "echo ready; exec sleep 60")
    child.expect("ready")
    command = supervised_child(ledger, procs)
    os.kill(child.pid, signal.SIGKILL)
    wait_until(lambda: is_dead(command), TIMEOUT_S, "the command to be hung up")
    restored = orjson.loads(run_cli("restore", "--json", url=ledger).stdout)
    assert [(r["state"], r["reason"]) for r in restored] == [("lost_on_restore", "lost_on_restore")]
    assert "no longer running" in restored[0]["diagnostic"]


@pytest.mark.parametrize(
    ("words", "pty"),
    [
        ([], None),  # decided when it runs
        (["--pty"], True),
        (["--no-pty"], False),
        (["--stdin", "null"], False),  # the command's input is named: no terminal
        (["--background"], None),
    ],
)
def test_pty_is_one_tri_state_field(words: list[str], pty: bool | None) -> None:
    parsed = RunOptions.parse(vars(parse(RUN, [*words, "--", "true"])))
    assert parsed.pty is pty


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_gives_the_terminal_back_and_shuts_down(
    spawn: Spawn, ledger: str, procs: Processes, signum: signal.Signals
) -> None:
    before = lflags(spawn("sleep", "0"))
    child = run_in_terminal(
        spawn, ledger, "--grace", "5", "--", "sh", "-c", "echo ready; exec sleep 60"
    )
    child.expect("ready")
    supervised_child(ledger, procs)
    wait_until(lambda: not lflags(child) & termios.ISIG, TIMEOUT_S, "the keys to be relayed")
    os.kill(child.pid, signum)
    assert ended(child) == 128 + signum
    assert lflags(child) == before
    record = only_process(ledger)
    assert (record["state"], record["reason"]) == ("terminated", "runner_shutdown")
