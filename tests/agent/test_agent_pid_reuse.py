"""A pid reused by another process is never adopted nor signalled (docs/design.md §18.4, issue
28; Nomad once killed unrelated processes by trusting a reused pid).

The fixture: records an earlier agent of this host held (its owner provably dead), whose OS
facts name a live process the test started -- a decoy that notes every signal it receives --
once with a start time that is not the decoy's (the pid was reused), once with the decoy's own
start time but no run marker in its environment. A new agent's takeover records each ``lost``
with a diagnostic naming why, and the decoys run on, unsignalled."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from _shared import Processes, child_env, command_registration, dead_owner, end_process
from procledger import ProcessState
from procledger.adapters.proc_facts import host_id
from procledger.agent.host import AGENT_ROLE, AGENT_TIMINGS
from procledger.application.outbox import this_host_id
from procledger.domain.records import OsFacts

from .conftest import start_time_of
from .live_agent import TERMINAL_KINDS, LiveAgent

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the anchor and /proc: Linux")

DECOY = """
import signal, sys, time
noted = sys.argv[1]
def note(signum, frame):
    with open(noted, "a") as file:
        file.write(f"{signum}\\n")
for signum in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}:
    try:
        signal.signal(signum, note)
    except (OSError, ValueError):
        pass
print("ready", flush=True)
while True:
    time.sleep(3600)
"""
"""``python -c DECOY NOTED``: an unrelated process that appends to NOTED each signal it gets."""


@pytest.fixture
def decoys(tmp_path: Path) -> Iterator[list[tuple[subprocess.Popen[str], Path]]]:
    """Two decoys, each a process group of its own (as a run's child is), and where each notes
    its signals; killed by their ``Popen`` (exact pid, unreaped) and reaped at teardown."""
    started = []
    for name in ("reused", "unmarked"):
        noted = tmp_path / f"signals-{name}"
        decoy = subprocess.Popen(
            [sys.executable, "-c", DECOY, str(noted)], stdout=subprocess.PIPE, text=True,
            env=child_env(), start_new_session=True,
        )  # fmt: skip
        started.append((decoy, noted))
    try:
        for decoy, _ in started:
            assert decoy.stdout is not None
            assert decoy.stdout.readline() == "ready\n"
        yield started
    finally:
        for decoy, _ in started:
            end_process(decoy)


def test_a_record_naming_a_live_stranger_is_recorded_lost_and_the_stranger_left_alone(
    tmp_path: Path, procs: Processes, decoys: list[tuple[subprocess.Popen[str], Path]]
) -> None:
    agent = LiveAgent(f"sqlite:///{tmp_path}/ledger.db")
    here = this_host_id()
    assert here is not None
    earlier_agent = dead_owner(f"{AGENT_ROLE}@{host_id()}")
    (reused, _), (unmarked, _) = decoys
    starts = {decoy.pid: start_time_of(decoy.pid) for decoy, _ in decoys}
    facts = {
        "reused": OsFacts(pid=reused.pid, pgid=reused.pid, start_time=starts[reused.pid] - 50,
                          host_id=here),
        "unmarked": OsFacts(pid=unmarked.pid, pgid=unmarked.pid,
                            start_time=starts[unmarked.pid], host_id=here),
    }  # fmt: skip
    with agent.ledger() as registry:
        for name, os_facts in facts.items():
            registration = command_registration(name, ["sleep", "300"])
            _, lease = registry.register_claimed(registration, earlier_agent, AGENT_TIMINGS.ttl_ms)
            assert lease is not None
            registry.record_backgrounded(name, registry.now_ms(), os=os_facts)

    status = agent.start()
    assert (status["held"], status["takeover"]["held"], status["takeover"]["lost"]) == (0, 0, 2)

    expected = {
        "reused": f"OS pid {reused.pid}: the pid was reused",
        "unmarked": f"OS pid {unmarked.pid}: its environment has no PROCLEDGER_RUN",
    }
    for name, words in expected.items():
        record = agent.record(name)
        assert record.state is ProcessState.lost_on_restore, (name, record.state)
        assert words in (record.diagnostic or ""), (name, record.diagnostic)
        assert "exit status is unknown" in (record.diagnostic or ""), record.diagnostic
        kinds = [kind for kind in agent.event_kinds(name) if kind in TERMINAL_KINDS]
        assert kinds == ["lost"], (name, kinds)
        assert "stop_requested" not in agent.event_kinds(name)

    for decoy, noted in decoys:
        process = psutil.Process(decoy.pid)
        assert decoy.poll() is None, "a decoy died"
        assert process.status() not in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE)
        assert start_time_of(decoy.pid) == starts[decoy.pid]
        assert not noted.exists(), f"decoy {decoy.pid} was signalled: {noted.read_text()}"
    after = agent.status()
    assert after is not None
    assert after["children"] == 0
