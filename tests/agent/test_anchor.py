"""The anchor with real processes: orphans re-parent to it and their exits are journaled with
the start time of the process that ended; the agent is restarted with backoff; a stop leaves
the supervised children running (issue 28)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from _shared import Processes, child_env, end_process, fill_up, small_tmpfs, wait_until
from procledger.agent.anchor import Backoff, UsageError, parse_args
from procledger.agent.exit_journal import boot_id

from .conftest import AnchorRun, ppid_of, start_time_of

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="a child subreaper is Linux's")


def orphan_of(anchor: AnchorRun, procs: Processes, pidfile: Path) -> psutil.Process:
    """The agent's child named by ``pidfile``, re-parented to the anchor by a ``kill -9`` of
    the agent (whose exit the anchor then journals, marked as the agent's)."""
    anchor.await_spawned()
    written = wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 30, "a pid")
    child = procs.add(int(written))
    agent_pid = anchor.starts()[0][0]
    assert ppid_of(child.pid) == agent_pid
    os.kill(agent_pid, signal.SIGKILL)
    wait_until(lambda: ppid_of(child.pid) == anchor.pid, 30, "the orphan to re-parent")
    killed = anchor.await_record(agent_pid, agent=True)
    assert (killed.signal, killed.exit_code) == (signal.SIGKILL, None)
    return child


def test_an_orphan_that_exits_is_journaled_once_with_its_code_and_start_time(
    anchor: AnchorRun, procs: Processes, tmp_path: Path
) -> None:
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    pidfile = procs.pidfile("child.pid")
    anchor.start("--spawn", f"echo $$ > {pidfile}; read line < {fifo}; exit 7")
    child = orphan_of(anchor, procs, pidfile)
    start_while_running = start_time_of(child.pid)
    with open(fifo, "w") as go:  # the child waits for this line, then exits 7
        go.write("go\n")
    record = anchor.await_record(child.pid)
    assert (record.exit_code, record.signal, record.returncode) == (7, None, 7)
    # Read after the reap, /proc/<pid> would be gone (None) or a stranger's: equal to the value
    # read while it ran, it was read from the zombie, and names this process and no later one.
    assert record.start_time == start_while_running
    assert (record.boot_id, record.core_dumped) == (boot_id(), False)
    assert anchor.stop() == 0
    assert [r for r in anchor.records() if r.pid == child.pid and not r.agent] == [record]


def test_an_orphan_killed_by_a_signal_is_journaled_with_the_signal(
    anchor: AnchorRun, procs: Processes
) -> None:
    pidfile = procs.pidfile("child.pid")
    anchor.start("--spawn", f"echo $$ > {pidfile}; exec sleep 3600")
    child = orphan_of(anchor, procs, pidfile)
    start_while_running = start_time_of(child.pid)
    child.send_signal(signal.SIGUSR1)  # psutil checks it is still that process
    record = anchor.await_record(child.pid)
    assert (record.signal, record.exit_code) == (signal.SIGUSR1, None)
    assert record.returncode == -signal.SIGUSR1
    assert record.start_time == start_while_running


def test_an_exit_that_cannot_be_journaled_stays_a_zombie_until_it_can(
    anchor: AnchorRun, procs: Processes, tmp_path: Path
) -> None:
    """A full disk: the kernel keeps the status (and the pid) until the record is written; the
    agent, meanwhile, is still restarted."""
    with small_tmpfs(tmp_path / "small-disk", "1m") as disk:
        anchor.journal = disk / "journal"
        pidfile = procs.pidfile("child.pid")
        # One record a segment: the newest segment is always empty, so the next record needs a
        # new page of the tmpfs, which a full disk refuses.
        anchor.start("--spawn", f"echo $$ > {pidfile}; exec sleep 3600",
                     anchor_args=("--segment-bytes", "1"))  # fmt: skip
        child = orphan_of(anchor, procs, pidfile)
        filler = fill_up(disk / "filler")
        child.kill()
        wait_until(lambda: "kept for a retry" in anchor.stderr.read_text(), 30, "a failed write")
        assert child.status() == psutil.STATUS_ZOMBIE
        assert ppid_of(child.pid) == anchor.pid
        second_agent, _ = anchor.await_starts(2)[1]
        os.kill(second_agent, signal.SIGKILL)
        anchor.await_starts(3)  # restarted without its record
        assert "the agent's exit is not journaled" in anchor.stderr.read_text()
        filler.unlink()
        record = anchor.await_record(child.pid)
        assert record.signal == signal.SIGKILL
        wait_until(lambda: not child.is_running(), 30, "the zombie to be reaped")
        assert anchor.stop() == 0
        assert [r for r in anchor.records() if r.pid == child.pid] == [record]


def test_the_agent_is_restarted_with_backoff_that_resets_after_a_healthy_run(
    anchor: AnchorRun,
) -> None:
    healthy_s = 1.0
    anchor.start(
        "--crash-first", "3", anchor_args=("--backoff-max", "0.4", "--healthy-s", str(healthy_s))
    )
    pid, started = anchor.await_starts(4)[3]  # three quick exits, then one that stays up
    wait_until(lambda: time.monotonic() >= started + healthy_s, 10, "a healthy run")
    for count in (5, 6, 7, 8):
        os.kill(pid, signal.SIGKILL)  # the agent, unreaped by the anchor until it is journaled
        pid, _ = anchor.await_starts(count)[count - 1]
    starts = anchor.starts()
    delays = [0.1, 0.2, 0.4, 0.1, 0.2, 0.4, 0.4]
    assert anchor.delays() == delays
    for (_, before), (_, after), delay in zip(starts, starts[1:], delays, strict=False):
        assert after - before >= delay
    agent_records = [r for r in anchor.records() if r.agent]
    assert [r.pid for r in agent_records] == [p for p, _ in starts[:7]]
    assert [r.returncode for r in agent_records] == [3, 3, 3] + [-signal.SIGKILL] * 4


def test_sigterm_stops_the_agent_and_the_anchor_but_not_the_supervised_children(
    anchor: AnchorRun, procs: Processes
) -> None:
    orphaned = procs.pidfile("orphaned.pid")
    anchor.start("--spawn", f"echo $$ > {orphaned}; exec sleep 3600")
    orphan = orphan_of(anchor, procs, orphaned)  # the anchor's child by now
    agent_pid, _ = anchor.await_starts(2)[1]
    assert anchor.stop() == 0
    assert ["term", str(agent_pid)] in anchor.marker_lines()
    assert anchor.await_record(agent_pid, agent=True).exit_code == 0
    assert orphan.is_running()
    assert orphan.status() != psutil.STATUS_ZOMBIE
    assert ppid_of(orphan.pid) != anchor.pid
    assert [r for r in anchor.records() if r.pid == orphan.pid] == []


def test_an_agent_that_ignores_sigterm_is_killed_after_the_grace(anchor: AnchorRun) -> None:
    anchor.start("--ignore-term", anchor_args=("--stop-grace", "0.2"))
    agent_pid, _ = anchor.await_starts(1)[0]
    assert anchor.stop() == 0
    assert anchor.await_record(agent_pid, agent=True).signal == signal.SIGKILL


def test_a_stop_during_the_backoff_ends_the_anchor_at_once(anchor: AnchorRun) -> None:
    anchor.start("--crash-first", "100", anchor_args=("--backoff-initial", "60"))
    wait_until(lambda: anchor.delays() == [60.0], 30, "a backoff")
    assert anchor.stop(timeout=10) == 0


def test_a_second_anchor_on_the_same_journal_is_refused(anchor: AnchorRun) -> None:
    anchor.start()
    anchor.await_starts(1)
    argv = [sys.executable, "-m", "procledger.agent.anchor", "--journal", str(anchor.journal)]
    second = subprocess.run(
        [*argv, "--", "true"], capture_output=True, text=True, env=child_env(), timeout=30,
        check=False,
    )  # fmt: skip
    assert second.returncode == 2
    assert "another anchor" in second.stderr


def test_after_the_anchor_is_killed_a_new_anchor_takes_the_journal_while_the_agent_lives(
    anchor: AnchorRun, tmp_path: Path
) -> None:
    """The journal's lock dies with the anchor: the agent never inherits it."""
    anchor.start()
    agent_pid, _ = anchor.await_starts(1)[0]
    assert anchor.process is not None
    anchor.process.kill()
    anchor.process.wait(30)
    assert psutil.Process(agent_pid).status() != psutil.STATUS_ZOMBIE  # orphaned, alive
    argv = [sys.executable, "-m", "procledger.agent.anchor", "--journal", str(anchor.journal)]
    with open(tmp_path / "second-stderr", "wb") as stderr:
        second = subprocess.Popen(
            [*argv, "--backoff-initial", "60", "--", "true"], stderr=stderr, env=child_env()
        )
    try:
        log = tmp_path / "second-stderr"
        wait_until(lambda: "restarting in 60" in log.read_text(), 30, "the second anchor")
        second.send_signal(signal.SIGTERM)
        assert second.wait(30) == 0
    finally:
        end_process(second)
    assert [r.exit_code for r in anchor.records() if r.agent] == [0]  # `true`, journaled


@pytest.mark.parametrize(
    ("uptimes", "delays"),
    [
        ([0, 0, 0, 0, 0], [0.1, 0.2, 0.4, 0.8, 1.0]),
        ([0, 0, 10, 0], [0.1, 0.2, 0.1, 0.2]),
        ([10, 10], [0.1, 0.1]),
    ],
)
def test_backoff_doubles_to_its_maximum_and_resets_after_a_healthy_run(
    uptimes: list[float], delays: list[float]
) -> None:
    backoff = Backoff(initial=0.1, maximum=1.0, healthy_s=10.0)
    assert [backoff.after_exit(uptime) for uptime in uptimes] == delays


def test_the_command_line_takes_options_before_the_double_dash() -> None:
    options = parse_args(["--journal", "j", "--backoff-max=2", "--", "agent", "--journal", "x"])
    assert options is not None
    assert (options.journal, options.agent_argv) == (
        os.path.abspath("j"),
        ["agent", "--journal", "x"],
    )
    assert (options.backoff.initial, options.backoff.maximum) == (0.1, 2.0)
    assert (options.stop_grace_s, options.segment_bytes) == (30.0, 1 << 20)
    assert parse_args(["--help", "--", "agent"]) is None


@pytest.mark.parametrize(
    ("argv", "culprit"),
    [
        (["--", "agent"], "--journal DIR is required"),
        (["--journal", "j"], "the agent's command is missing"),
        (
            [
                "--journal",
                "j",
                "--",
            ],
            "the agent's command is missing",
        ),
        (["--journal", "j", "agent"], "unknown option 'agent'"),
        (["--journal", "j", "--backoff-max", "soon", "--", "a"], "not 'soon'"),
        (["--journal", "j", "--stop-grace", "nan", "--", "a"], "finite"),
        (["--journal", "j", "--healthy-s", "-1", "--", "a"], "0 or more"),
        (["--journal"], "--journal needs a value"),
    ],
)
def test_a_bad_command_line_names_the_culprit(argv: list[str], culprit: str) -> None:
    with pytest.raises(UsageError, match=culprit):
        parse_args(argv)
