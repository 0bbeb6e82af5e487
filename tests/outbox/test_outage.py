"""Never lose an outcome (issue 13): a child that exits while the store is down is recorded with
its true exit code once the store is back -- by its own supervisor, or, when that supervisor was
SIGKILLed during the outage, by ``restore`` or a recovery sweep delivering the outbox."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _shared import Processes, child_env, end_process, wait_until
from procledger import LeaseOwner, LeaseTimings, open_registry
from procledger.adapters.outbox import default_outbox
from procledger.domain.vocabulary import ProcessState, TerminalReason
from procledger.recovery import RecoveryWorker
from procledger.supervisor.supervisor import Supervisor

from .conftest import Outage

OUTAGE_S = 20.0
"""How long the store stays down once the outcome waits for it: far past the 5 s after which
0.1.0 gave the outcome up (issue 13)."""


def _gated_exit(gate: Path, code: int) -> list[str]:
    """A child that exits with ``code`` once ``gate`` exists (it polls: the test does not)."""
    return ["sh", "-c", f'while [ ! -e "{gate}" ]; do sleep 0.02; done; exit {code}']


def _completed_events(url: str, process_id: str) -> int:
    registry = open_registry(url)
    try:
        return sum(e.kind == "completed" for e in registry.events(process_id))
    finally:
        registry.close()


def test_an_exit_during_an_outage_is_recorded_once_the_store_is_back(
    outage: Outage, tmp_path: Path
) -> None:
    gate, lines = tmp_path / "gate", []
    registry = open_registry(outage.url)
    outbox = default_outbox()
    try:
        with Supervisor(
            registry, owner=LeaseOwner.local_process("outage"), notice=lines.append
        ) as sup:
            handle = sup.start(_gated_exit(gate, 7))
            outage.begin()
            try:
                gate.touch()
                wait_until(lambda: sup.returncode(handle) == 7, 30, "the child to exit")
                (entry,) = wait_until(outbox.entries, 30, "the outcome in the outbox")
                assert (entry.process_id, entry.state, entry.exit_code) == (
                    handle.process_id,
                    "exited",
                    7,
                )
                if outage.kind == "sqlite":  # a full disk fails at once: the wait is said
                    wait_until(lambda: lines, 30, "the waiting notice")
                    assert "retrying" in lines[0]
                    assert not lines[0].startswith("procledger")  # the CLI names itself
                    assert handle.process_id in lines[0]
                time.sleep(OUTAGE_S)  # not a synchronisation: the outage outlasts many retries
                assert len(lines) <= 1  # said once, not once per retry
            finally:
                outage.end()
            record = sup.wait(handle, timeout=120)
        assert (record.state, record.reason, record.exit_code) == (
            ProcessState.exited,
            TerminalReason.exited,
            7,
        )
        assert outbox.entries() == []  # deleted once the store accepted it
        if lines:  # said once when waiting began, once when it got through
            assert len(lines) == 2
            assert "recorded" in lines[1]
    finally:
        registry.close()
    assert _completed_events(outage.url, handle.process_id) == 1


def test_an_outage_that_outlasts_the_lease_keeps_the_outcome(
    outage: Outage, tmp_path: Path
) -> None:
    """The lease lapses during the outage, so the terminal write meets ``LeaseLost`` and the
    lease must be claimed again -- while the store is still down. That claim's failure is
    retried like the write's; it used to end the wait and delete the outbox entry, leaving the
    process ``running`` and ``restore`` with "outcome unknown"."""
    gate, lines = tmp_path / "gate", []
    registry = open_registry(outage.url)
    outbox = default_outbox()
    timings = LeaseTimings(ttl_ms=600, renew_ms=200)
    try:
        with Supervisor(
            registry, owner=LeaseOwner.local_process("outage"), timings=timings, notice=lines.append
        ) as sup:
            handle = sup.start(_gated_exit(gate, 7))
            outage.begin()
            try:
                gate.touch()
                wait_until(lambda: sup.returncode(handle) == 7, 30, "the child to exit")
                wait_until(outbox.entries, 30, "the outcome in the outbox")
                time.sleep(3)  # not a synchronisation: the outage outlasts the 0.6 s lease
                assert len(outbox.entries()) == 1
            finally:
                outage.end()
            record = sup.wait(handle, timeout=120)
        assert (record.state, record.exit_code) == (ProcessState.exited, 7)
        assert outbox.entries() == []
    finally:
        registry.close()
    assert _completed_events(outage.url, handle.process_id) == 1


SUPERVISOR_PROCESS = """
import os, sys, threading
from procledger import LeaseOwner, open_registry
from procledger.supervisor.supervisor import Supervisor

url, owner_id, gate, out = sys.argv[1:5]
registry = open_registry(url)
supervisor = Supervisor(registry, owner=LeaseOwner.local_process(owner_id))
script = f'while [ ! -e "{gate}" ]; do sleep 0.02; done; exit 7'
handle = supervisor.start(["sh", "-c", script])
with open(out + ".tmp", "w") as f:
    f.write(handle.process_id)
os.rename(out + ".tmp", out)
threading.Event().wait(300)
"""


@pytest.mark.parametrize("recovery", ["restore", "sweep"])
def test_an_exit_is_recorded_after_its_supervisor_was_killed_during_the_outage(
    outage: Outage, tmp_path: Path, procs: Processes, recovery: str
) -> None:
    gate, out, owner_id = tmp_path / "gate", tmp_path / "pid", "killed-in-outage"
    argv = [sys.executable, "-c", SUPERVISOR_PROCESS, outage.url, owner_id, str(gate), str(out)]
    host = subprocess.Popen(argv, env=child_env())
    procs.add(host.pid)
    try:
        wait_until(out.exists, 60, "the supervisor to start its child")
        process_id = out.read_text()
        outbox = default_outbox()  # the same state directory as the supervisor's
        outage.begin()
        try:
            gate.touch()
            wait_until(outbox.entries, 30, "the outcome in the outbox")
            host.send_signal(signal.SIGKILL)  # mid-outage: only the outbox knows the outcome
            host.wait(30)
        finally:
            outage.end()
    finally:
        end_process(host)

    registry = open_registry(outage.url)
    try:
        assert registry.get(process_id).state is ProcessState.running  # nothing recorded yet
        if recovery == "restore":
            with Supervisor(registry, owner=LeaseOwner.local_process(owner_id)) as sup:
                written = sup.restore()
            assert [r.id for r in written] == [process_id]
        else:
            RecoveryWorker(registry, LeaseOwner.local_process("worker")).sweep()
        record = registry.get(process_id)
        assert (record.state, record.reason, record.exit_code) == (
            ProcessState.exited,
            TerminalReason.exited,
            7,
        )
        assert registry.get_lease(process_id) is None
        assert outbox.entries() == []
    finally:
        registry.close()
    assert _completed_events(outage.url, process_id) == 1
