"""Both the agent and its anchor die (docs/design.md §18, issue 28): the children run on under
init, whose reaping nobody journals. ``procledger agent start`` then adopts each (pid, start
time and run marker; a pidfd), and records an end it could not see as ``lost_on_restore``
with a diagnostic saying the exit status is unknown -- never a guessed code; a ``stop`` of such
a child stops it by its recorded identity and records the stop's terminal by the signal it died
after, as ``procledger stop`` records an orphan it stops itself."""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest

from _shared import Processes, is_dead, wait_until
from procledger import ProcessState, TerminalReason

from .live_agent import DEADLINE, TERMINAL_KINDS, LiveAgent, ppid_of, sleeper

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the anchor and /proc: Linux")


def orphaned_child(agent: LiveAgent, procs: Processes) -> tuple[str, psutil.Process]:
    """A background child whose agent and anchor were both killed (the anchor first): its id
    and process, still running."""
    first = agent.start()
    pidfile = procs.pidfile("child")
    ran = agent.run_background(*sleeper(pidfile))
    assert ran.returncode == 0, ran.stderr
    process_id = ran.stdout.strip()
    child = procs.await_pid(pidfile)
    agent.kill(first["anchor_pid"], "procledger.agent.anchor")
    agent.kill(first["pid"])
    assert agent.status() is None
    assert not is_dead(child), "the child died with its agent and anchor"
    dead = (first["pid"], first["anchor_pid"])  # a dying process's threads end one by one:
    wait_until(lambda: ppid_of(child.pid) not in dead, DEADLINE, "the child to be re-parented")
    assert agent.record(process_id).state is ProcessState.running
    return process_id, child


def test_a_child_of_a_dead_agent_and_anchor_is_adopted_and_its_unseen_end_recorded_lost(
    tmp_path: Path, procs: Processes
) -> None:
    agent = LiveAgent(f"sqlite:///{tmp_path}/ledger.db")
    process_id, child = orphaned_child(agent, procs)

    status = agent.start()
    assert status["started"] is True
    assert (status["children"], status["held"]) == (1, 1)
    assert (status["takeover"]["held"], status["takeover"]["lost"]) == (1, 0)
    record = agent.record(process_id)
    assert record.state is ProcessState.running
    assert record.os is not None
    assert record.os.pid == child.pid

    child.terminate()  # its exit status goes to init: nobody can say what it was
    final = agent.await_terminal(process_id)
    assert final.state is ProcessState.lost_on_restore, (final.state, final.diagnostic)
    assert final.exit_code is None
    assert final.signal is None
    assert "exit status is unknown" in (final.diagnostic or ""), final.diagnostic
    assert "init" in (final.diagnostic or ""), final.diagnostic  # and why: init reaped it
    kinds = [kind for kind in agent.event_kinds(process_id) if kind in TERMINAL_KINDS]
    assert kinds == ["lost"]
    assert agent.status() is not None  # the new agent serves on


def test_a_stop_of_a_child_adopted_from_a_dead_agent_and_anchor_stops_it(
    tmp_path: Path, procs: Processes
) -> None:
    agent = LiveAgent(f"sqlite:///{tmp_path}/ledger.db")
    process_id, child = orphaned_child(agent, procs)
    assert agent.start()["held"] == 1

    stopped = agent.cli("stop", process_id)
    assert stopped.returncode == 0, stopped.stderr
    assert "stop requested" in stopped.stdout
    final = agent.await_terminal(process_id)
    wait_until(lambda: is_dead(child), DEADLINE, "the child to be gone")
    assert TerminalReason.interrupted in final.stop_requested
    kinds = [kind for kind in agent.event_kinds(process_id) if kind in TERMINAL_KINDS]
    assert kinds == ["completed"], kinds
    # As `procledger stop` records an orphan it stops itself: by the signal it died after.
    assert (final.state, final.signal) == (ProcessState.interrupted, 2), final.diagnostic
