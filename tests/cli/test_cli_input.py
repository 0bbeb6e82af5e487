"""What ``procledger run`` accepts (docs/design.md §8): options before the command are parsed
strictly and a usage error records nothing; the child reads this process's stdin (a pipe or the
terminal) unless told otherwise; a missing or non-executable command exits 127 or 126 and is
recorded failed; ``--grace`` is finite and at most a day; what the ledger cannot keep as text
(non-UTF-8 argv or working directory) is refused before anything is recorded; the first Ctrl-C
on a child that ignores it says how to kill it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import psutil
import pytest

from _shared import CLI, SRC, Processes, child_env, run_cli, wait_until

from .conftest import Terminal, ignoring, supervise_sleeper
from .test_cli_run import listed, only_process


def nothing_recorded(url: str, tmp_path: Path) -> None:
    """No record: the ledger is empty, or was never even created."""
    if Path(url.removeprefix("sqlite:///")).exists():
        assert listed(url, "--all") == []


def one_line(stderr: str) -> None:
    assert stderr.count("\n") == 1, stderr
    assert "Traceback" not in stderr


# -- strict options --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("run", "--backgroud", "--", "sleep", "5"),
        ("run", "--backgroud", "sleep", "5"),
        ("run", "--grace"),
        ("run", "--stdin", "/no/such/file", "--", "true"),
        ("run", "--background", "--stdin", "inherit", "--", "true"),
        ("run", "--", ""),
        ("run", "--background", "--", "", "x"),
        ("run", "--stop-signal", "FOO", "--", "true"),
    ],
)
def test_a_usage_error_exits_2_in_one_line_and_records_nothing(
    ledger: str, tmp_path: Path, args: tuple[str, ...]
) -> None:
    ran = run_cli(*args, url=ledger)
    assert ran.returncode == 2, ran.stderr
    one_line(ran.stderr)
    assert ran.stderr.startswith("procledger run: ")
    assert ran.stdout == ""
    nothing_recorded(ledger, tmp_path)


def test_a_mistyped_option_is_named(ledger: str) -> None:
    ran = run_cli("run", "--backgroud", "--", "sleep", "5", url=ledger)
    assert "--backgroud" in ran.stderr
    assert "--stop-signal" in run_cli("run", "--stop-signal", "0", "true", url=ledger).stderr


def test_options_after_the_command_s_first_word_are_the_command_s(ledger: str) -> None:
    ran = run_cli("run", "--json", "echo", "--backgroud", url=ledger)
    assert ran.returncode == 0, ran.stderr
    assert orjson.loads(ran.stdout)["input"]["argv"] == ["echo", "--backgroud"]
    assert "--backgroud" in ran.stderr  # echo's output: with --json it goes to stderr


@pytest.mark.parametrize("grace", ["inf", "-inf", "nan", "1e308", "-1", "86401", "soon"])
def test_grace_must_be_finite_and_at_most_a_day(ledger: str, tmp_path: Path, grace: str) -> None:
    ran = run_cli("run", "--grace", grace, "--", "true", url=ledger)
    assert ran.returncode == 2, ran.stderr
    one_line(ran.stderr)
    assert "--grace" in ran.stderr
    nothing_recorded(ledger, tmp_path)
    stop = run_cli("stop", "some-id", "--grace", grace, url=ledger)
    assert stop.returncode == 2, stop.stderr


def test_a_day_of_grace_is_accepted(ledger: str) -> None:
    assert run_cli("run", "--grace", "86400", "--", "true", url=ledger).returncode == 0


# -- exit codes of commands that cannot run --------------------------------------------------


def test_a_missing_command_exits_127_and_is_recorded_failed(ledger: str) -> None:
    ran = run_cli("run", "--", "no-such-command-anywhere", url=ledger)
    assert ran.returncode == 127
    one_line(ran.stderr)
    assert "no-such-command-anywhere" in ran.stderr
    assert (only_process(ledger)["state"], only_process(ledger)["status"]) == ("failed", "failed")
    detached = run_cli("run", "--background", "--", "no-such-command-anywhere", url=ledger)
    assert detached.returncode == 127
    one_line(detached.stderr)


def test_a_command_that_cannot_be_executed_exits_126(ledger: str, tmp_path: Path) -> None:
    script = tmp_path / "not-executable.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    ran = run_cli("run", "--", str(script), url=ledger)
    assert ran.returncode == 126
    one_line(ran.stderr)
    assert str(script) in ran.stderr
    assert only_process(ledger)["state"] == "failed"


# -- non-UTF-8 input: refused before anything is recorded -----------------------------------


def run_bytes(*args: bytes) -> subprocess.CompletedProcess[bytes]:
    """``procledger ARGS...`` with arguments as the bytes a shell may pass (any, not UTF-8)."""
    return subprocess.run(
        [*map(os.fsencode, CLI), *args],
        capture_output=True,
        env=child_env(),
        timeout=60,
        check=False,
    )


def test_a_non_utf8_argument_is_refused_before_anything_is_recorded(
    ledger: str, tmp_path: Path
) -> None:
    ran = run_bytes(b"--url", ledger.encode(), b"run", b"--", b"echo", b"\xff\xfe")
    assert ran.returncode == 2
    one_line(ran.stderr.decode())
    assert b"UTF-8" in ran.stderr
    nothing_recorded(ledger, tmp_path)


def test_a_non_utf8_working_directory_is_refused(ledger: str, tmp_path: Path) -> None:
    odd = os.path.join(os.fsencode(tmp_path), b"dir-\xff")
    os.mkdir(odd)
    ran = subprocess.run(
        [*CLI, "--url", ledger, "run", "--", "true"],
        capture_output=True,
        env=child_env(),
        cwd=odd,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 1
    one_line(ran.stderr.decode())
    assert b"working directory" in ran.stderr
    nothing_recorded(ledger, tmp_path)


@pytest.mark.parametrize(
    ("args", "option"),
    [
        ([b"run", b"--ready-file", b"/tmp/ready-\xff", b"--", b"true"], b"--ready-file"),
        ([b"run", b"--ready-output", b"\xff", b"--", b"true"], b"--ready-output"),
        ([b"ps", b"--label", b"\xff"], b"--label"),
        ([b"ps", b"--state", b"running", b"--state", b"\xff"], b"--state"),
        ([b"sweep", b"--owner", b"\xff"], b"--owner"),
    ],
)
def test_an_option_that_is_not_utf8_is_a_usage_error(
    ledger: str, tmp_path: Path, args: list[bytes], option: bytes
) -> None:
    ran = run_bytes(b"--url", ledger.encode(), *args)
    assert ran.returncode == 2, ran.stderr
    one_line(ran.stderr.decode())
    assert option + b": b'" in ran.stderr
    assert b"not valid UTF-8" in ran.stderr
    nothing_recorded(ledger, tmp_path)


def test_a_url_that_is_not_utf8_is_a_usage_error_and_creates_nothing(tmp_path: Path) -> None:
    url = b"sqlite:///" + os.fsencode(tmp_path) + b"/ledger-\xff.db"
    ran = run_bytes(b"--url", url, b"run", b"--", b"true")
    assert ran.returncode == 2, ran.stderr
    one_line(ran.stderr.decode())
    assert b"--url" in ran.stderr
    assert os.listdir(tmp_path) == []


def test_a_stdin_path_that_is_not_utf8_is_read(ledger: str, tmp_path: Path) -> None:
    # --stdin is opened here and never recorded: any bytes name a file.
    source = os.path.join(os.fsencode(tmp_path), b"input-\xff")
    Path(os.fsdecode(source)).write_text("from a file\n")
    ran = run_bytes(b"--url", ledger.encode(), b"run", b"--stdin", source, b"cat")
    assert (ran.returncode, ran.stdout) == (0, b"from a file\n"), ran.stderr


def test_a_deleted_working_directory_is_named(ledger: str, tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    remove_then_run = "import os, sys; os.rmdir(os.getcwd()); os.execv(sys.argv[1], sys.argv[1:])"
    ran = subprocess.run(
        [sys.executable, "-c", remove_then_run, *CLI, "--url", ledger, "run", "--", "true"],
        cwd=gone,
        capture_output=True,
        env=child_env(PYTHONPATH=str(SRC)),  # no relative entry: the interpreter resolves them
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 1, ran.stderr
    one_line(ran.stderr)
    assert "working directory was deleted" in ran.stderr
    nothing_recorded(ledger, tmp_path)


def test_an_environment_that_is_not_utf8_is_inherited_as_it_is(ledger: str) -> None:
    # Only its hash is recorded, so bytes a shell exported are no reason to refuse the run.
    env: dict[bytes, bytes] = {os.fsencode(k): os.fsencode(v) for k, v in child_env().items()}
    env[b"ODD_BYTES"] = b"caf\xe9"
    env.pop(b"PROCLEDGER_URL", None)
    ran = subprocess.run(
        [*CLI, "--url", ledger, "run", "--", "sh", "-c", 'printf %s "$ODD_BYTES"'],
        capture_output=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, b"caf\xe9", b"")
    assert only_process(ledger)["state"] == "exited"


# -- stdin ----------------------------------------------------------------------------------


def test_a_foreground_run_passes_its_piped_stdin_to_the_child(ledger: str) -> None:
    ran = subprocess.run(
        [*CLI, "--url", ledger, "run", "--", "cat"],
        input="hi\nthere\n",
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
        check=False,
    )
    assert (ran.returncode, ran.stdout) == (0, "hi\nthere\n"), ran.stderr


def test_stdin_null_and_a_file(ledger: str, tmp_path: Path) -> None:
    source = tmp_path / "input.txt"
    source.write_text("from a file\n")
    from_file = run_cli("run", "--stdin", str(source), "--", "cat", url=ledger)
    assert from_file.stdout == "from a file\n"
    null = subprocess.run(
        [*CLI, "--url", ledger, "run", "--stdin", "null", "--", "cat"],
        input="ignored\n",
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
        check=False,
    )
    assert (null.returncode, null.stdout) == (0, "")


def test_an_interactive_read_gets_what_is_typed(
    ledger: str, terminal: Callable[..., Terminal]
) -> None:
    term = terminal(
        "--url", ledger, "run", "--", "sh", "-c", 'echo ask; read line; echo "got <$line>"'
    )
    term.expect("ask")
    term.type("typed words\n")
    term.expect("got <typed words>", timeout=10)
    assert term.wait() == 0


def test_a_background_run_reads_dev_null(ledger: str, procs: Processes, tmp_path: Path) -> None:
    out = tmp_path / "what-it-read"
    script = f'read line; echo "status=$? line=<$line>" > "{out}.tmp"; mv "{out}.tmp" "{out}"'
    ran = run_cli("run", "--background", "--json", "--", "sh", "-c", script, url=ledger)
    assert ran.returncode == 0, ran.stderr
    with contextlib.suppress(psutil.NoSuchProcess):  # the detached supervisor, if still there
        procs.add(orjson.loads(ran.stdout)["first_started"]["owner"]["liveness"]["pid"])
    wait_until(out.exists, what="the background child to read its stdin")
    assert out.read_text() == "status=1 line=<>\n"  # end of file at once


# -- Ctrl-C ----------------------------------------------------------------------------------


def test_first_ctrl_c_on_a_child_that_ignores_it_says_how_to_kill(
    ledger: str, terminal: Callable[..., Terminal], procs: Processes
) -> None:
    ready = procs.pidfile("ignores-int")
    term = terminal(
        "--url", ledger, "run", "--no-pty", "--grace", "60", "--", *ignoring(ready, "SIGINT")
    )
    term.expect("ready")
    procs.await_pid(ready)
    term.ctrl_c()
    term.expect("stopping… press Ctrl-C again to kill")
    term.ctrl_c()
    assert term.wait() == 130
    assert only_process(ledger)["state"] == "killed"


def test_a_child_that_stops_on_ctrl_c_gets_no_hint(
    ledger: str, terminal: Callable[..., Terminal], procs: Processes
) -> None:
    term, _ = supervise_sleeper(terminal, procs, ledger)
    term.ctrl_c()
    assert term.wait() == 130
    assert "press Ctrl-C again" not in term.output


def test_an_id_that_is_not_utf8_is_a_one_line_error(ledger: str) -> None:
    assert run_cli("run", "--", "true", url=ledger).returncode == 0
    ran = subprocess.run(
        [*map(os.fsencode, CLI), b"--url", ledger.encode(), b"show", b"\xff\xfe"],
        capture_output=True,
        env=child_env(),
        timeout=60,
        check=False,
    )
    assert ran.returncode == 1
    one_line(ran.stderr.decode())
    assert ran.stderr.startswith(
        b"procledger show: no process b'\\xff\\xfe': a process id is UTF-8"
    )
