"""A kept orphan is never invisible (docs/design.md §6.2, §8; issue 28): after `restore
--keep-orphans` records a process ``lost`` while its child runs on, `ps` lists it as an orphan
still running, `show` says so and what to do, and `stop ID` stops that child by its recorded
identity -- OS pid *and* start time on this host, never a pid alone -- and records how it ended
(``orphan_stopped``). Real children throughout, each killed by exact pid at the test's end.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest

from _shared import (
    Processes,
    command_registration,
    is_dead,
    run_cli,
    start_cli,
    wait_until,
)
from procledger import open_registry
from procledger.adapters.liveness import local_identity, read_process_start
from procledger.domain.leases import Acquired, LeaseOwner
from procledger.domain.records import OsFacts

SLEEPER = 'echo $$ > "{0}.tmp" && mv "{0}.tmp" "{0}" && exec sleep 120'
IGNORING = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(120)
"""


def kept_orphan(
    url: str, procs: Processes, argv: list[str], pidfile: Path
) -> tuple[str, psutil.Process]:
    """A foreground `procledger run` of ``argv`` (which writes ``pidfile``), SIGKILLed while
    its quiet child lives on, then `restore --keep-orphans`: the lost process's id and the
    child, still running."""
    runner = start_cli("run", "--", *argv, url=url, procs=procs)
    try:
        child = procs.await_pid(pidfile)
        wait_until(lambda: listed(url), 30, "the run to be recorded running")
        runner.send_signal(signal.SIGKILL)
    finally:
        runner.wait(30)
    restored = run_cli("restore", "--keep-orphans", "--json", url=url)
    assert restored.returncode == 0, restored.stderr
    (lost,) = orjson.loads(restored.stdout)
    assert lost["state"] == "lost_on_restore"
    assert "left running unsupervised (keep_orphans)" in lost["diagnostic"]
    assert not is_dead(child)
    return lost["id"], child


def listed(url: str, *options: str) -> list[dict[str, Any]]:
    ran = run_cli("ps", "--json", *options, url=url)
    assert ran.returncode == 0, ran.stderr
    records: list[dict[str, Any]] = orjson.loads(ran.stdout)["records"]
    return records


def shown(url: str, process_id: str) -> dict[str, Any]:
    ran = run_cli("show", process_id, "--json", url=url)
    assert ran.returncode == 0, ran.stderr
    document: dict[str, Any] = orjson.loads(ran.stdout)
    return document


def test_a_kept_orphan_is_listed_shown_and_stopped_by_its_identity(
    shared_url: str, procs: Processes
) -> None:
    pidfile = procs.pidfile("orphan.pid")
    process_id, child = kept_orphan(
        shared_url, procs, ["sh", "-c", SLEEPER.format(pidfile)], pidfile
    )

    ps = run_cli("ps", url=shared_url)
    assert ps.returncode == 0, ps.stderr
    (row,) = [line.split("\t") for line in ps.stdout.splitlines()[1:]]
    assert row[:3] == [process_id, "lost_on_restore (orphan running)", "abandoned"]
    assert "kept orphans" in ps.stderr
    assert "procledger stop ID" in ps.stderr
    as_json = orjson.loads(run_cli("ps", "--json", url=shared_url).stdout)
    assert set(as_json) == {"records", "damaged"}  # the JSON is the stored record, no more
    assert [(r["id"], r["state"]) for r in as_json["records"]] == [(process_id, "lost_on_restore")]

    text = run_cli("show", process_id, url=shared_url).stdout
    assert "lost_on_restore (abandoned; orphan running)" in text
    assert f"still runs unsupervised on this host: procledger stop {process_id}" in text
    before = shown(shared_url, process_id)
    assert set(before) == {"record", "events"}

    stopped = run_cli("stop", process_id, "--mode", "terminate", "--grace", "5", url=shared_url)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout == (
        f"stopped the orphaned child (OS pid {child.pid}) of process {process_id} here by its "
        "recorded identity (sent SIGTERM, SIGKILL; it ended after SIGTERM)\n"
    )
    wait_until(lambda: is_dead(child), 10, "the orphan to be gone")
    after = shown(shared_url, process_id)
    assert after["record"]["state"] == "lost_on_restore"  # the lifecycle is untouched
    last = after["events"][-1]
    assert last["kind"] == "orphan_stopped"
    payload = last["payload"]
    assert (payload["pid"], payload["reason"], payload["signal"]) == (child.pid, "terminated", 15)
    assert (payload["sent"], payload["survivors"]) == ([15, 9], [])
    assert payload["by"].startswith("procledger-cli@")
    assert f"pid={child.pid}" in run_cli("show", process_id, url=shared_url).stdout

    assert listed(shared_url) == []
    again = run_cli("stop", process_id, url=shared_url)
    assert again.stdout == f"process {process_id} already ended: lost_on_restore\n"
    assert shown(shared_url, process_id)["events"] == after["events"]  # recorded once


def test_an_orphan_that_ignores_the_interrupt_runs_on_and_nothing_is_recorded(
    tmp_path: Path, procs: Processes
) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    pidfile = procs.pidfile("stubborn.pid")
    argv = [sys.executable, "-c", IGNORING, str(pidfile)]
    process_id, child = kept_orphan(url, procs, argv, pidfile)
    events = shown(url, process_id)["events"]

    asked = run_cli("stop", process_id, "--mode", "interrupt", "--grace", "0.3", url=url)
    assert asked.returncode == 0, asked.stderr
    assert "sent SIGINT to the orphaned child" in asked.stdout
    assert "it is still running (try --mode terminate)" in asked.stdout
    assert not is_dead(child)
    assert shown(url, process_id)["events"] == events
    assert [r["id"] for r in listed(url)] == [process_id]

    killed = run_cli("stop", process_id, "--mode", "kill", url=url)
    assert killed.returncode == 0, killed.stderr
    assert "(sent SIGKILL; it ended after SIGKILL)" in killed.stdout
    wait_until(lambda: is_dead(child), 10, "the orphan to be killed")
    last = shown(url, process_id)["events"][-1]
    assert (last["kind"], last["payload"]["signal"], last["payload"]["reason"]) == (
        "orphan_stopped",
        9,
        "killed",
    )


@pytest.mark.parametrize("wrong", ["start time", "host"])
def test_a_lost_record_naming_a_stranger_is_never_listed_nor_signalled(
    tmp_path: Path, procs: Processes, owner: LeaseOwner, wrong: str
) -> None:
    """A ``lost`` record whose pid now belongs to another process (another start time), or
    that names another host: not an orphan of ours -- `ps` does not list it, `stop` says it
    ended and signals nothing."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    stranger = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        procs.add(stranger.pid)
        identity, start = local_identity(), read_process_start(stranger.pid)
        assert identity is not None
        assert start is not None
        facts = OsFacts(
            pid=stranger.pid,
            pgid=stranger.pid,
            start_time=int(start) + (1 if wrong == "start time" else 0),
            host_id=identity.host_id if wrong == "start time" else "another-host:1",
        )
        registry = open_registry(url)
        try:
            registry.register(command_registration("lost-1", ["sleep", "120"]))
            claimed = registry.claim_lease("lost-1", owner, 30_000)
            assert isinstance(claimed, Acquired)
            registry.record_started("lost-1", registry.now_ms(), os=facts)
            registry.record_lost("lost-1", diagnostic="kept", lease=claimed.lease)
        finally:
            registry.close()
        assert listed(url) == []
        assert "orphan" not in run_cli("ps", "--all", url=url).stdout
        stopped = run_cli("stop", "lost-1", "--mode", "kill", url=url)
        assert stopped.stdout == "process lost-1 already ended: lost_on_restore\n"
        assert stranger.poll() is None  # still running: never signalled
        assert [e["kind"] for e in shown(url, "lost-1")["events"]][-1] == "lost"
    finally:
        stranger.kill()
        stranger.wait()
