"""A background child's output is two files it writes itself, never a pipe to the agent
(docs/design.md §18, issue 28): ``/proc/<pid>/fd/1`` and ``2`` are regular files in the run's
output folder, and ``procledger logs`` reads them."""

from __future__ import annotations

import functools
import os
import stat
import sys
from pathlib import Path

import pytest

from _shared import Processes, wait_until

from .live_agent import DEADLINE, LiveAgent

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the anchor and /proc: Linux")

WRITER = (
    'echo $$ > "$1.tmp" && mv "$1.tmp" "$1"; '
    'for i in 1 2 3; do echo "out $i"; echo "err $i" >&2; done; exec sleep 300'
)


def _holds(path: Path, text: str) -> bool:
    return path.read_text() == text


def test_a_background_child_s_stdout_and_stderr_are_files_in_its_output_folder(
    tmp_path: Path, procs: Processes
) -> None:
    agent = LiveAgent(f"sqlite:///{tmp_path}/ledger.db")
    pidfile = procs.pidfile("child")
    ran = agent.run_background("sh", "-c", WRITER, "sh", str(pidfile))
    assert ran.returncode == 0, ran.stderr
    process_id = ran.stdout.strip()
    child = procs.await_pid(pidfile)
    folder = agent.output_folder(process_id)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        path = f"/proc/{child.pid}/fd/{fd}"
        assert Path(os.readlink(path)) == folder / name
        assert stat.S_ISREG(os.stat(path).st_mode), f"fd {fd} is not a regular file"
    assert os.readlink(f"/proc/{child.pid}/fd/0") == "/dev/null"
    pipes = [fd for fd in os.listdir(f"/proc/{child.pid}/fd")
             if os.readlink(f"/proc/{child.pid}/fd/{fd}").startswith("pipe:")]  # fmt: skip
    assert pipes == [], f"the child holds pipes: {pipes}"
    status = agent.status()
    assert status is not None
    assert child.ppid() == status["pid"]

    expected = {"stdout": "out 1\nout 2\nout 3\n", "stderr": "err 1\nerr 2\nerr 3\n"}
    for name, text in expected.items():
        wait_until(functools.partial(_holds, folder / name, text), DEADLINE, f"the {name} file")
        assert agent.logs(process_id, "--stream", name) == text
    assert agent.logs(process_id) == expected["stdout"] + expected["stderr"]


def test_an_output_probe_sees_what_the_child_wrote_before_it_was_followed(
    tmp_path: Path, procs: Processes
) -> None:
    """A child that prints its ready line at once, then stays quiet: the agent's file follower
    used to hold that first read until some other file event came (seconds, or never), so
    ``--wait-ready`` waited on a child long ready."""
    agent = LiveAgent(f"sqlite:///{tmp_path}/ledger.db")
    for attempt in range(3):
        pidfile = procs.pidfile(f"ready-{attempt}")
        script = 'echo $$ > "$1.tmp" && mv "$1.tmp" "$1"; echo listening; exec sleep 300'
        ran = agent.cli(
            "run", "--background", "--ready-output", "listening", "--wait-ready",
            "--ready-timeout", "10", "--", "sh", "-c", script, "sh", str(pidfile),
        )  # fmt: skip
        procs.await_pid(pidfile)
        assert ran.returncode == 0, ran.stderr
        record = agent.record(ran.stdout.strip())
        assert record.ready_at_ms is not None
