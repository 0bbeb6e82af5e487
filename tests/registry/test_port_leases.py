"""Leased ports (docs/design.md §19, issue 30): ``port="auto"`` takes the lowest port of a range
that no live process of the ledger holds and nothing on this host is bound to, as a lease in
the ledger; the lease is released when its process ends, and a reservation whose start never
registered lapses.

The acceptance test of the issue: 200 concurrent ``Supervisor.start(port="auto")`` from eight
separate OS processes, each start a child that binds ``$PORT`` itself (without
``SO_REUSEADDR``: a port anything else is bound to fails it), against a SQLite file and a
PostgreSQL schema -- 200 distinct ports, every child bound its own, and the ports something
outside the ledger listens on were skipped.

Each test takes a narrow range at a random base below Linux's ephemeral ports (32768-60999,
where outgoing connections would take ports from under a test) and away from the default range
(20000-29999), so tests running in parallel under xdist rarely share a port; every process a
test starts is killed by its exact pid at the end (``procs``).
"""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, closing
from typing import Any

import pytest

from _shared import Processes, child_env
from procledger import (
    Acquired,
    LeaseOwner,
    Originator,
    PortTaken,
    ProcessHandle,
    ProcessInput,
    ProcessRecord,
    ProcessRegistration,
    ProcessRegistry,
    RecoveryDisposition,
    StopPolicy,
    Supervisor,
    open_registry,
)
from procledger.adapters.proc_facts import host_id
from procledger.application.service_claims import RESERVATION_MS
from procledger.domain.registration import env_ref_for
from procledger.testing import FakeClock

SERVER = (
    "import os, socket, time\n"
    "s = socket.socket()\n"
    "s.bind(('0.0.0.0', int(os.environ['PORT'])))\n"
    "s.listen()\n"
    "time.sleep(600)\n"
)
"""A child that binds ``$PORT`` on every IPv4 address or fails (exit 1), then listens."""

WORKER = """
import json, sys
from procledger import LeaseOwner, StopPolicy, Supervisor, open_registry

url, server = sys.argv[1], sys.argv[2]
low, high, count = map(int, sys.argv[3:])
registry = open_registry(url)
owner = LeaseOwner.local_process("port-worker")
supervisor = Supervisor(registry, owner=owner, stop=StopPolicy(grace_s=2.0))
print("ready", flush=True)
sys.stdin.readline()
handles = []
for _ in range(count):
    argv = [sys.executable, "-S", "-c", server]
    handle = supervisor.start(argv, port="auto", port_range=(low, high))
    handles.append(handle)
    record = registry.get(handle.process_id)
    print(json.dumps({"id": record.id, "pid": record.os.pid, "port": record.port}), flush=True)
ready = [supervisor.wait_ready(handle, timeout=60) for handle in handles]
done = [[r.id, r.state.value, r.ready_at_ms is not None] for r in ready]
print(json.dumps({"done": done}), flush=True)
sys.stdin.readline()
supervisor.shutdown(grace_s=2.0)
registry.close()
"""
"""One worker process: a Supervisor of its own on the shared ledger, ``count`` starts of
``server`` with ``port="auto"`` once told to go, each child's id, pid and port reported as it
starts, then whether each became ready (bound its port); it stops them all when told to."""

WORKERS, STARTS_EACH = 8, 25


def narrow_range(width: int) -> tuple[int, int]:
    """A range of ``width`` ports at a random base from 10240 to below the default range."""
    low = random.randrange(10240, 20000 - width)
    return low, low + width - 1


def listening(port: int, family: socket.AddressFamily = socket.AF_INET) -> socket.socket:
    """A socket of this test listening on ``port`` (IPv4 wildcard, or IPv6 loopback only)."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    if family is socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.bind(("::1" if family is socket.AF_INET6 else "0.0.0.0", port))
    sock.listen()
    return sock


def ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


class Workers:
    """The worker processes of one test, started at once and recorded in ``procs``, with
    every child they report."""

    def __init__(self, url: str, port_range: tuple[int, int], procs: Processes) -> None:
        env = child_env()
        self.procs = procs
        self.workers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    WORKER,
                    url,
                    SERVER,
                    *map(str, port_range),
                    str(STARTS_EACH),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for _ in range(WORKERS)
        ]
        for worker in self.workers:
            procs.add(worker.pid)

    def tell(self, line: str) -> None:
        for worker in self.workers:
            assert worker.stdin is not None
            worker.stdin.write(line + "\n")
            worker.stdin.flush()

    def await_ready(self) -> None:
        for worker in self.workers:
            assert self.line(worker) == "ready"

    def line(self, worker: subprocess.Popen[str]) -> str:
        assert worker.stdout is not None
        line = worker.stdout.readline()
        assert line, f"worker {worker.pid} ended early (exit {worker.wait()})"
        return line.strip()

    def runs(self) -> tuple[list[dict[str, Any]], list[list[Any]]]:
        """Every start reported (its children recorded for cleanup), then each one's end."""
        started: list[dict[str, Any]] = []
        done: list[list[Any]] = []
        for worker in self.workers:
            while "done" not in (report := json.loads(self.line(worker))):
                self.procs.add(report["pid"])
                started.append(report)
            done += report["done"]
        return started, done

    def stop(self) -> None:
        self.tell("stop")
        for worker in self.workers:
            assert worker.wait(60) == 0
            for stream in (worker.stdin, worker.stdout):
                if stream is not None:
                    stream.close()


def test_200_concurrent_starts_get_200_distinct_ports_none_in_use(
    shared_url: str, procs: Processes
) -> None:
    count = WORKERS * STARTS_EACH
    low, high = narrow_range(count + 60)
    open_registry(shared_url).close()  # the tables, before eight processes race to make them
    with ExitStack() as bound:
        taken = {low, low + 2, low + 5, low + 40}
        for port in taken:
            bound.enter_context(listening(port))
        if ipv6():  # a listener on [::1] alone takes the port from a server on [::]
            taken.add(low + 3)
            bound.enter_context(listening(low + 3, socket.AF_INET6))
        workers = Workers(shared_url, (low, high), procs)
        workers.await_ready()
        began = time.monotonic()
        workers.tell("go")
        started, done = workers.runs()
        elapsed = time.monotonic() - began
        print(f"{count} concurrent starts, every child bound: {elapsed:.2f} s")  # -s shows it
        workers.stop()
    ports = [run["port"] for run in started]
    assert len(ports) == count
    assert len(set(ports)) == count, "a port was leased twice"
    assert not set(ports) & taken, "a port something else listens on was leased"
    assert all(low <= port <= high for port in ports)
    not_bound = [run for run in done if not run[2]]
    assert not not_bound, f"children that could not bind their $PORT: {not_bound}"
    # The lowest ports first: the leases fill the bottom of the range around what is taken
    # (and whatever else on this host happens to listen there).
    skipped = set(range(low, max(ports) + 1)) - set(ports)
    assert len(skipped - taken) <= 5, sorted(skipped - taken)
    assert elapsed < 60, f"200 starts took {elapsed:.1f} s"
    with closing(open_registry(shared_url)) as registry:  # every child ended: all released
        leases = registry.services.ports(host_id())
    assert {lease.port for lease in leases} == set(ports)
    assert not [lease for lease in leases if lease.live]


@pytest.fixture
def supervisor(registry: ProcessRegistry, owner: LeaseOwner) -> Iterator[Supervisor]:
    with Supervisor(registry, owner=owner, stop=StopPolicy(grace_s=2.0)) as running:
        yield running


def serve(
    supervisor: Supervisor, port_range: tuple[int, int], procs: Processes
) -> tuple[ProcessHandle, ProcessRecord]:
    """A child serving on a leased port, once it listens: its handle and record."""
    argv = [sys.executable, "-S", "-c", SERVER]
    handle = supervisor.start(argv, port="auto", port_range=port_range)
    record = supervisor.wait_ready(handle, timeout=30)
    assert record.os is not None
    procs.add(record.os.pid)
    assert record.ready_at_ms is not None, record.diagnostic
    assert record.port is not None
    return handle, record


def test_a_lease_is_released_when_its_process_ends(
    registry: ProcessRegistry, supervisor: Supervisor, procs: Processes
) -> None:
    port_range = narrow_range(20)
    handle, first = serve(supervisor, port_range, procs)
    _, second = serve(supervisor, port_range, procs)
    assert second.port > first.port
    (lease,) = registry.services.ports(host_id(), first.port)
    assert (lease.process_id, lease.live) == (first.id, True)
    assert supervisor.stop(handle, "kill").is_terminal
    (lease,) = registry.services.ports(host_id(), first.port)
    assert (lease.process_id, lease.live) == (first.id, False)
    _, again = serve(supervisor, port_range, procs)
    assert again.port == first.port, "the lowest port, released, is leased again"
    (lease,) = registry.services.ports(host_id(), first.port)
    assert (lease.process_id, lease.live) == (again.id, True)


def register_holder(registry: ProcessRegistry, process_id: str, port: int) -> None:
    """A process registered with a port (its lease) that has not started: it runs nothing."""
    registry.register(
        ProcessRegistration(
            id=process_id,
            input=ProcessInput.command(["true"], cwd="/"),
            disposition=RecoveryDisposition.owner_bound,
            originator=Originator.host(),
            env_ref=env_ref_for({}),
            port=port,
        )
    )


def test_a_port_leased_to_a_live_process_is_never_leased_again_even_unbound(
    registry: ProcessRegistry,
) -> None:
    """The ledger alone keeps a lease: a registered process that has not bound its port (its
    server still starting) keeps it from every later reservation."""
    low, high = narrow_range(10)
    register_holder(registry, "holder", low)
    assert registry.services.reserve_port(host_id(), "later", (low, high)) == low + 1
    (lease,) = registry.services.ports(host_id(), low)
    assert (lease.process_id, lease.live) == ("holder", True)


def test_among_many_leases_only_an_ended_holder_s_port_is_leased_again(
    registry: ProcessRegistry, owner: LeaseOwner
) -> None:
    """Past a few leases in the range, whose holders run is read in one query: those keep
    their ports, and the one whose process ended gives its port back."""
    low, high = narrow_range(40)
    for offset in range(30):
        register_holder(registry, f"holder-{offset}", low + offset)
    claimed = registry.claim_lease("holder-7", owner, 30_000)
    assert isinstance(claimed, Acquired)
    registry.record_abandoned("holder-7", "abandon_requested", lease=claimed.lease)
    assert registry.services.reserve_port(host_id(), "next", (low, high)) == low + 7
    assert registry.services.reserve_port(host_id(), "after", (low, high)) == low + 30


def test_a_reservation_that_never_registers_lapses(shared_url: str) -> None:
    clock = FakeClock()
    registry = open_registry(shared_url, clock=clock)
    try:
        low, high = narrow_range(10)
        here = host_id()
        assert registry.services.reserve_port(here, "never-registered", (low, high)) == low
        assert registry.services.reserve_port(here, "second", (low, high)) == low + 1
        clock.advance(RESERVATION_MS - 1)
        assert registry.services.ports(here, low)[0].live
        assert registry.services.reserve_port(here, "third", (low, high)) == low + 2
        clock.advance(1)
        (lapsed,) = registry.services.ports(here, low)
        assert (lapsed.process_id, lapsed.live) == ("never-registered", False)
        assert registry.services.reserve_port(here, "fourth", (low, high)) == low
    finally:
        registry.close()


def test_ports_bound_outside_the_ledger_are_skipped_and_a_full_range_is_refused(
    registry: ProcessRegistry,
) -> None:
    low, high = narrow_range(3)
    with listening(low), listening(low + 1):
        assert registry.services.reserve_port(host_id(), "a", (low, high)) == low + 2
        with pytest.raises(PortTaken, match=f"no free port in {low}-{high}"):
            registry.services.reserve_port(host_id(), "b", (low, high))
    assert registry.services.reserve_port(host_id(), "c", (low, high)) == low
