"""`ps` and `show` never say a plain ``running`` for a process whose holder is provably dead on
this host (docs/design.md §3.5, §8; issue 28): the row says ``running (supervisor gone)``,
`show` adds a hint saying what to do, and the JSON stays the stored record. Real supervisors
are killed (a foreground `procledger run`, the host agent and its anchor); every process a test
starts is killed by exact pid at its end.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path
from typing import Any

import orjson
import psutil

from _shared import (
    Processes,
    command_registration,
    dead_owner,
    is_dead,
    run_cli,
    start_cli,
    wait_until,
)
from procledger import open_registry
from procledger.adapters.liveness import local_identity
from procledger.domain.leases import Acquired, LeaseOwner, Liveness

SLEEPER = 'echo $$ > "{0}.tmp" && mv "{0}.tmp" "{0}" && exec sleep 120'


def rows(url: str, *options: str) -> tuple[list[list[str]], str]:
    """`ps`'s rows (into a pipe: tab-separated, header dropped) and its stderr."""
    ran = run_cli("ps", *options, url=url)
    assert ran.returncode == 0, ran.stderr
    return [line.split("\t") for line in ran.stdout.splitlines()[1:]], ran.stderr


def listed(url: str) -> dict[str, Any]:
    ran = run_cli("ps", "--json", url=url)
    assert ran.returncode == 0, ran.stderr
    document: dict[str, Any] = orjson.loads(ran.stdout)
    return document


def show_text(url: str, process_id: str) -> str:
    ran = run_cli("show", process_id, url=url)
    assert ran.returncode == 0, ran.stderr
    return ran.stdout


def test_a_run_whose_procledger_died_says_supervisor_gone(
    shared_url: str, procs: Processes
) -> None:
    pidfile = procs.pidfile("child.pid")
    runner = start_cli(
        "run", "--", "sh", "-c", SLEEPER.format(pidfile), url=shared_url, procs=procs
    )
    try:
        child = procs.await_pid(pidfile)
        wait_until(lambda: listed(shared_url)["records"], 30, "the run to be recorded")
        (row,), said = rows(shared_url)
        process_id = row[0]
        assert (row[1], said) == ("running", "")  # its supervisor lives: nothing to mark
        assert "hint" not in show_text(shared_url, process_id)
        stored = listed(shared_url)
        runner.send_signal(signal.SIGKILL)
    finally:
        runner.wait(30)

    (row,), said = rows(shared_url)
    assert row[:3] == [process_id, "running (supervisor gone)", "running"]
    assert "marked 'supervisor gone' are supervised by nobody" in said
    assert listed(shared_url) == stored  # JSON: the stored record, unchanged
    text = show_text(shared_url, process_id)
    assert "running (running; supervisor gone)" in text
    assert "its supervisor is gone, so nothing will record how it ends: procledger restore" in text
    shown = orjson.loads(run_cli("show", process_id, "--json", url=shared_url).stdout)
    assert set(shown) == {"record", "events"}
    assert shown["record"]["state"] == "running"

    restored = run_cli("restore", url=shared_url)
    assert restored.returncode == 0, restored.stderr
    wait_until(lambda: is_dead(child), 30, "restore to stop the orphaned child")
    assert rows(shared_url)[0] == []
    assert "supervisor gone" not in show_text(shared_url, process_id)


def test_an_agents_run_says_supervisor_gone_until_a_new_agent_takes_it_over(
    tmp_path: Path, procs: Processes
) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    pidfile = procs.pidfile("child.pid")
    ran = run_cli("run", "--background", "--", "sh", "-c", SLEEPER.format(pidfile), url=url)
    assert ran.returncode == 0, ran.stderr
    process_id = ran.stdout.strip()
    child = procs.await_pid(pidfile)
    record = listed(url)["records"][0]
    agent = procs.add(record["first_started"]["owner"]["liveness"]["pid"])
    (anchor_file,) = Path(os.environ["XDG_STATE_HOME"]).glob("procledger/agent/*/anchor.pid")
    anchor = procs.add(int(anchor_file.read_text()))
    assert agent.ppid() == anchor.pid
    anchor.kill()  # first, or it would start the agent again
    agent.kill()
    psutil.wait_procs([anchor, agent], timeout=10)
    assert not is_dead(child)

    (row,), _ = rows(url)
    assert row[:2] == [process_id, "running (supervisor gone)"]
    text = show_text(url, process_id)
    assert "procledger agent start: a new agent takes it over" in text

    started = run_cli("agent", "start", url=url)
    assert started.returncode == 0, started.stderr
    wait_until(lambda: rows(url)[0][0][1] == "running", 30, "a new agent to take it over")
    assert not is_dead(child)


def test_only_a_holder_provably_dead_on_this_host_is_judged(
    tmp_path: Path, procs: Processes
) -> None:
    """A dead holder of this host and boot is marked; one on another host (or another boot)
    may live for all this host can tell, and is not."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    here = local_identity()
    assert here is not None
    gone = dead_owner("procledger-cli@gone")
    elsewhere = LeaseOwner(
        owner_id="procledger-cli@elsewhere",
        incarnation_id=uuid.uuid4().hex,
        liveness=Liveness(
            kind="local_process",
            host_id="another-host:1",
            boot_id=here.boot_id,
            pid=gone.liveness.pid or 1,
            process_start="1",
        ),
    )
    registry = open_registry(url)
    try:
        for process_id, holder in (("dead-here", gone), ("elsewhere", elsewhere)):
            registry.register(command_registration(process_id, ["sleep", "1"]))
            claimed = registry.claim_lease(process_id, holder, 60_000)
            assert isinstance(claimed, Acquired)
            registry.record_started(process_id, registry.now_ms())
    finally:
        registry.close()
    states = {row[0]: row[1] for row in rows(url)[0]}
    assert states == {"dead-here": "running (supervisor gone)", "elsewhere": "running"}
    assert "its child is gone too: procledger abandon dead-here" in show_text(url, "dead-here")
    assert "hint" not in show_text(url, "elsewhere")


def test_the_agents_role_is_named_once() -> None:
    """`show`'s hint knows the agent's owner id without importing the agent."""
    from procledger.agent.host import AGENT_ROLE
    from procledger.cli.hot.marks import AGENT_ROLE as _AGENT_ROLE

    assert AGENT_ROLE == _AGENT_ROLE
