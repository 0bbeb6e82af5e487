"""``procledger ports`` lists who holds which leased port, and ``procledger stop :PORT`` stops
the process holding a port of this host -- only if procledger started it (docs/design.md §19,
issue 30: agent sessions that collided on port 3000 killed each other's servers with
``pkill -f``).

Real processes throughout: services started through the library (a ``Supervisor`` in this test
process, which carries out the stops ``procledger stop`` records), a ``python -m http.server``
procledger never heard of, each killed by its exact pid at the end (``procs``).
"""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest

from _shared import Processes, child_env, is_dead, run_cli, wait_until
from procledger import (
    LeaseOwner,
    ProcessHandle,
    ProcessRecord,
    Readiness,
    RestartPolicy,
    StopPolicy,
    Supervisor,
    open_registry,
)
from procledger.adapters.port_owners import listeners
from procledger.adapters.proc_facts import host_id

SERVER = (
    "import os, socket, time\n"
    "s = socket.socket()\n"
    "s.bind(('127.0.0.1', int(os.environ['PORT'])))\n"
    "s.listen()\n"
    "time.sleep(600)\n"
)
"""A child that listens on ``$PORT``."""


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, ledger: str) -> str:
    return ledger if request.param == "sqlite" else str(request.getfixturevalue("postgres_ledger"))


@pytest.fixture
def supervisor(url: str, procs: Processes) -> Iterator[Supervisor]:
    """A supervisor in this test process: the live owner ``procledger stop`` asks."""
    registry = open_registry(url)
    owner = LeaseOwner.local_process(f"test-{uuid.uuid4().hex[:8]}")
    try:
        with Supervisor(registry, owner=owner, stop=StopPolicy(grace_s=2.0)) as running:
            yield running
            procs.kill_all()
    finally:
        registry.close()


def port_range() -> tuple[int, int]:
    """Twenty ports at a random base, below the default range and Linux's ephemeral ports."""
    low = random.randrange(10240, 19980)
    return low, low + 19


def free_port() -> int:
    """A port nothing listens on now (the OS's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve(
    supervisor: Supervisor, procs: Processes, argv: list[str] | None = None, **options: Any
) -> tuple[ProcessHandle, ProcessRecord]:
    """A procledger child (``SERVER`` on a leased port by default), once ready."""
    options.setdefault("port", "auto")
    options.setdefault("port_range", port_range())
    handle = supervisor.start(argv or [sys.executable, "-S", "-c", SERVER], **options)
    record = supervisor.wait_ready(handle, timeout=30)
    assert record.os is not None
    procs.add(record.os.pid)
    assert record.ready_at_ms is not None, record.diagnostic
    return handle, record


def listener(port: int, procs: Processes) -> psutil.Process:
    """The one process listening on ``port``, once one does (recorded for cleanup)."""
    (pid,) = wait_until(lambda: listeners(port).pids, what=f"a listener on port {port}")
    return procs.add(pid)


def leases(url: str, *options: str) -> list[dict[str, Any]]:
    ran = run_cli("ports", "--json", *options, url=url)
    assert ran.returncode == 0, ran.stderr
    rows: list[dict[str, Any]] = orjson.loads(ran.stdout)
    return rows


def test_ports_lists_a_live_lease_with_its_name(
    url: str, supervisor: Supervisor, procs: Processes
) -> None:
    empty = run_cli("ports", url=url)
    assert (empty.returncode, empty.stdout) == (0, "")
    assert "no live leases" in empty.stderr
    _, record = serve(supervisor, procs, name="web")
    assert record.port is not None
    assert leases(url) == [
        {
            "port": record.port,
            "process_id": record.id,
            "name": "web",
            "state": "running",
            "live": True,
            "host_id": host_id(),
            "this_host": True,
            "claimed_at_ms": leases(url)[0]["claimed_at_ms"],
        }
    ]
    listed = run_cli("ports", url=url)  # into a pipe: tab-separated, whole values
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == [
        "PORT\tPROCESS\tNAME\tSTATE\tHOST",
        f"{record.port}\t{record.id}\tweb\trunning\t{host_id()}",
    ]


def test_stop_port_stops_the_service_holding_it_and_releases_the_lease(
    url: str, supervisor: Supervisor, procs: Processes
) -> None:
    handle, record = serve(supervisor, procs, name="api", restart=RestartPolicy(mode="always"))
    other_handle, other = serve(supervisor, procs, name="other")
    child = procs.add(record.os.pid if record.os else 0)
    ran = run_cli("stop", f":{record.port}", "--mode", "terminate", url=url)
    assert ran.returncode == 0, ran.stderr
    said = f"port {record.port}: service api ({record.id}) stopped"
    assert ran.stdout.startswith(said), ran.stdout
    final = supervisor.wait(handle, timeout=30)
    assert (final.id, final.state.value) == (record.id, "terminated")
    assert is_dead(child)
    assert [row["port"] for row in leases(url)] == [other.port], "released; the other kept"
    released = {row["port"]: row for row in leases(url, "--all")}[record.port]
    assert (released["live"], released["state"]) == (False, "terminated")
    assert supervisor.returncode(other_handle) is None  # untouched


def test_stop_port_stops_a_procledger_child_s_descendant_listening_without_a_lease(
    url: str, supervisor: Supervisor, procs: Processes
) -> None:
    """No lease: the listener is found through /proc, and it is a child of the recorded one
    (a shell that started a server)."""
    port = free_port()
    server = f"'{sys.executable}' -m http.server {port} --bind 127.0.0.1"
    argv = ["sh", "-c", f"{server} & wait"]
    handle, record = serve(supervisor, procs, argv, port=None, ready=Readiness(port=port))
    served = listener(port, procs)
    assert record.os is not None
    assert served.ppid() == record.os.pid != served.pid
    ran = run_cli("stop", f":{port}", "--mode", "terminate", "--json", url=url)
    assert ran.returncode == 0, ran.stderr
    assert orjson.loads(ran.stdout)["id"] == record.id
    assert supervisor.wait(handle, timeout=30).state.value == "terminated"
    wait_until(lambda: is_dead(served), what="the server to end with its tree")


def test_stop_port_refuses_a_listener_procledger_did_not_start(
    url: str, supervisor: Supervisor, procs: Processes
) -> None:
    serve(supervisor, procs)  # the ledger has a running process: it must not be mistaken
    port = free_port()
    stranger = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    procs.add(stranger.pid)
    assert listener(port, procs).pid == stranger.pid
    ran = run_cli("stop", f":{port}", url=url)
    assert ran.returncode == 1
    assert ran.stderr == (
        f"procledger stop: port {port} is held by pid {stranger.pid} ({sys.executable} -m "
        f"http.server {port} --bind 127.0.0.1), which procledger did not start; nothing was "
        "stopped\n"
    )
    assert ran.stdout == ""
    assert stranger.poll() is None, "never signalled"
    assert listeners(port).pids == (stranger.pid,)
    stranger.kill()
    stranger.wait()


def test_stop_port_where_nothing_listens_says_so(url: str, supervisor: Supervisor) -> None:
    port = free_port()
    ran = run_cli("stop", f":{port}", url=url)
    assert (ran.returncode, ran.stdout) == (1, "")
    assert ran.stderr == f"procledger stop: nothing listens on port {port}\n"


@pytest.mark.parametrize("fast", ["1", "0"])
@pytest.mark.parametrize(
    "text", [":abc", ":0", ":70000", ":", ":-1", ": 80", ":８０", ":" + "9" * 5000]
)
def test_a_port_that_is_no_port_is_a_usage_error(tmp_path: Path, text: str, fast: str) -> None:
    env = child_env(PROCLEDGER_FAST=fast)
    env.pop("PROCLEDGER_URL", None)
    ran = run_cli("stop", text, url=f"sqlite:///{tmp_path}/ledger.db", env=env)
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.count("\n") == 1, ran.stderr
    assert ran.stderr.startswith("procledger stop: invalid value for ID: ")
    assert "names no port (:PORT takes a port from 1 to 65535)" in ran.stderr
    assert list(tmp_path.iterdir()) == []  # nothing opened, nothing created
