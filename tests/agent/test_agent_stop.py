"""``procledger agent stop`` (docs/design.md §18, issue 28): by default the agent and its anchor
go and the children run on -- the next agent adopts them; ``--stop-children`` stops each child
first and records how it ended (``runner_shutdown``), whether this agent spawned it or adopted
it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest

from _shared import Processes, is_dead, wait_until
from procledger import ProcessState, TerminalReason

from .live_agent import DEADLINE, TERMINAL_KINDS, LiveAgent, ppid_of, sleeper

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the anchor and /proc: Linux")


def start_sleepers(
    agent: LiveAgent, procs: Processes, tmp_path: Path, count: int, tag: str
) -> list[tuple[str, psutil.Process]]:
    """``count`` sleepers started by the agent: their ids and processes."""
    started = []
    for n in range(count):
        pidfile = procs.pidfile(f"{tag}-{n}")
        process_id = agent.start_child(sleeper(pidfile), tmp_path)
        started.append((process_id, procs.await_pid(pidfile)))
    return started


def stop_agent(agent: LiveAgent, *options: str) -> dict[str, Any]:
    ran = agent.cli("agent", "stop", "--json", *options)
    assert ran.returncode == 0, ran.stderr
    said: dict[str, Any] = orjson.loads(ran.stdout)
    assert said["stopped"] is True, said
    assert agent.status() is None
    return said


def assert_shut_down(agent: LiveAgent, process_id: str, child: psutil.Process) -> None:
    final = agent.await_terminal(process_id)
    shut_down = (ProcessState.terminated, TerminalReason.runner_shutdown)
    assert (final.state, final.reason) == shut_down, (process_id, final.diagnostic)
    assert final.signal == 15
    wait_until(lambda: is_dead(child), DEADLINE, f"child {child.pid} to be gone")
    kinds = [kind for kind in agent.event_kinds(process_id) if kind in TERMINAL_KINDS]
    assert kinds == ["completed"], (process_id, kinds)


def test_agent_stop_leaves_the_children_running_and_the_next_agent_adopts_them(
    tmp_path: Path, procs: Processes
) -> None:
    agent = LiveAgent(f"sqlite:///{tmp_path}/ledger.db")
    first = agent.start()
    children = start_sleepers(agent, procs, tmp_path, 3, "left")
    said = stop_agent(agent)
    assert said["stop_children"] is False
    wait_until(lambda: not psutil.pid_exists(first["anchor_pid"])
               or psutil.Process(first["anchor_pid"]).status() == psutil.STATUS_ZOMBIE,
               DEADLINE, "the anchor to be gone")  # fmt: skip
    for process_id, child in children:
        assert not is_dead(child), f"child {child.pid} died with its agent"
        assert ppid_of(child.pid) not in (first["pid"], first["anchor_pid"])
        assert agent.record(process_id).state is ProcessState.running

    status = agent.start()
    assert (status["children"], status["held"]) == (3, 3)
    assert (status["takeover"]["held"], status["takeover"]["lost"]) == (3, 0)
    for process_id, child in children:
        record = agent.record(process_id)
        assert record.state is ProcessState.running
        assert record.os is not None
        assert record.os.pid == child.pid


def test_agent_stop_with_stop_children_stops_and_records_each_child_it_spawned(
    tmp_path: Path, procs: Processes
) -> None:
    agent = LiveAgent(f"sqlite:///{tmp_path}/ledger.db")
    agent.start()
    children = start_sleepers(agent, procs, tmp_path, 3, "spawned")
    assert stop_agent(agent, "--stop-children")["stop_children"] is True
    for process_id, child in children:
        assert_shut_down(agent, process_id, child)


def test_agent_stop_with_stop_children_records_each_child_it_adopted_after_a_crash(
    tmp_path: Path, procs: Processes
) -> None:
    # Adopted from a killed agent: the children are the anchor's, which journals their exits.
    agent = LiveAgent(f"sqlite:///{tmp_path}/ledger.db")
    first = agent.start()
    children = start_sleepers(agent, procs, tmp_path, 2, "adopted")
    agent.kill(first["pid"])
    assert agent.await_serving(other_than=first["pid"])["held"] == 2
    children += start_sleepers(agent, procs, tmp_path, 1, "spawned")
    stop_agent(agent, "--stop-children")
    for process_id, child in children:
        assert_shut_down(agent, process_id, child)


def test_agent_stop_with_stop_children_records_each_child_it_adopted_after_a_stop(
    tmp_path: Path, procs: Processes
) -> None:
    # Adopted after `agent stop`: the children went to init, which journals nothing.
    agent = LiveAgent(f"sqlite:///{tmp_path}/ledger.db")
    agent.start()
    children = start_sleepers(agent, procs, tmp_path, 2, "adopted")
    stop_agent(agent)
    assert agent.start()["held"] == 2
    stop_agent(agent, "--stop-children")
    for process_id, child in children:
        assert_shut_down(agent, process_id, child)
