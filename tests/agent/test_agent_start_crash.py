"""The agent killed at each step of a start (docs/design.md §18, issue 28): SIGKILL at
``after_register`` (``starting`` on record, no child), ``after_spawn`` (a child, not on record)
and ``before_backgrounded`` (the write about to be made), through the failpoints of
``procledger.supervisor.failpoints``. The anchor starts the agent again, the new agent's takeover
says what became of the start, and ``run --background`` tells the user that: an id and exit 0
when the child runs (recorded running, adopted, stoppable), an error and exit 1 when it never
ran (recorded lost, nothing runs)."""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest

from _shared import Processes, wait_until
from procledger import ProcessRecord, ProcessState
from procledger.supervisor import os_seam

from .live_agent import DEADLINE, LiveAgent, run_marker, sleeper

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the anchor and /proc: Linux")


def _the_one_process(agent: LiveAgent) -> ProcessRecord:
    with agent.ledger() as registry:
        (record,) = registry.list_processes({"status": "any"})
    return record


def test_killed_after_register_the_start_is_recorded_lost_and_nothing_runs(
    tmp_path: Path, procs: Processes
) -> None:
    agent = LiveAgent(f"sqlite:///{tmp_path}/ledger.db")
    fired = tmp_path / "fired"
    pidfile = procs.pidfile("child")
    ran = agent.run_background(*sleeper(pidfile), PROCLEDGER_FAILPOINT=f"after_register:{fired}")
    assert fired.exists(), "the failpoint did not fire"
    record = _the_one_process(agent)
    assert ran.returncode == 1, (ran.stdout, ran.stderr)
    assert f"the agent died while starting process {record.id}" in ran.stderr
    assert "lost_on_restore" in ran.stderr
    assert "Traceback" not in ran.stderr
    assert ran.stdout == ""

    status = agent.await_serving()
    assert record.first_started is not None
    assert status["pid"] != record.first_started.owner.liveness.pid  # a new agent
    assert (status["held"], status["takeover"]["lost"]) == (0, 1)
    assert record.state is ProcessState.lost_on_restore
    assert "never ran" in (record.diagnostic or "")
    assert "exit status is unknown" in (record.diagnostic or "")
    assert agent.event_kinds(record.id).count("lost") == 1
    assert not pidfile.exists()
    assert os_seam.carrying(run_marker(record)) == []


@pytest.mark.parametrize("point", ["after_spawn", "before_backgrounded"])
def test_killed_after_the_spawn_the_child_runs_on_adopted_and_a_stop_stops_it(
    point: str, tmp_path: Path, procs: Processes
) -> None:
    agent = LiveAgent(f"sqlite:///{tmp_path}/ledger.db")
    fired = tmp_path / "fired"
    pidfile = procs.pidfile("child")
    ran = agent.run_background(*sleeper(pidfile), PROCLEDGER_FAILPOINT=f"{point}:{fired}")
    assert fired.exists(), "the failpoint did not fire"
    child = procs.await_pid(pidfile)
    record = _the_one_process(agent)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == record.id

    assert record.first_started is not None
    first_agent = record.first_started.owner.liveness.pid
    status = agent.await_serving(other_than=first_agent)
    assert (status["children"], status["held"], status["takeover"]["held"]) == (1, 1, 1)
    assert status["takeover"]["lost"] == 0
    assert (record.state, record.backgrounded) == (ProcessState.running, True)
    assert record.os is not None
    assert record.os.pid == child.pid
    assert os_seam.carrying(run_marker(record)) == [child.pid]
    assert child.ppid() == status["anchor_pid"]  # re-parented to the anchor, not to init
    assert agent.event_kinds(record.id).count("backgrounded") == 1

    stopped = agent.cli("stop", record.id)
    assert stopped.returncode == 0, stopped.stderr
    final = agent.await_terminal(record.id)
    assert final.state is ProcessState.interrupted, (final.state, final.diagnostic)
    assert final.signal == 2
    wait_until(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE,
               DEADLINE, "the child to be gone")  # fmt: skip
    kinds = agent.event_kinds(record.id)
    assert [kind for kind in kinds if kind in ("completed", "lost", "abandoned")] == ["completed"]
