"""The host agent (issue 28) beside what it replaced and beside supervisord, in one run, bounded
in time. Each measurement runs in a sandbox of its own (``XDG_STATE_HOME`` and
``XDG_RUNTIME_DIR`` in a temporary folder, a SQLite ledger there), and every process it started
-- the anchor, the agents, every child, supervisord and its programs -- is killed by its exact
pid (a pidfd opened after its start time was checked) at the end.

    PYTHONPATH=src python benchmarks/agent.py [--quick] [--counts 1,100,1000] [--idle S]
        [--samples N] [--children N] [--kills K] [--before CHECKOUT] [--no-supervisord]
        [--baselines DIR] [--skip memory,latency,before,drill] [--seed N]

(a) Memory: the anchor's and the agent's RSS and PSS (``/proc/PID/smaps_rollup``, medians of 5
    readings) with 1, 100 and 1,000 ``sleep 3600`` children, started through the agent's socket
    by 8 client threads at once (``run --background`` sends the same ``start`` order after
    ~0.4 s of CLI start-up: 1,000 of those one at a time would take minutes); the cost of each
    extra child. Beside it supervisord with as many programs (its own venv: ``pip install
    supervisor`` under ``--baselines``), and the detached per-child supervisor the agent
    replaced (``--before``: a checkout of afd535a, installed into a venv of its own; without
    it, issue 28's figure, measured earlier, is quoted).
(b) Idle CPU: with the largest count, the agent's, the anchor's and supervisord's CPU over the
    same ``--idle`` seconds (utime + stime from ``/proc/PID/stat``), as % of one core. The agent
    renews each child's lease every ``AGENT_TIMINGS.renew_ms``, a round that a short window
    holds or misses by chance: the line says which (``--idle`` longer than that period holds
    one).
(c) Start to running and stop to gone, with a warm agent holding those idle children, calls
    interleaved, p50 and p90 of ``--samples``: ``procledger run --background`` (a whole CLI)
    and the agent's ``start`` order over its socket (the agent's own part: spawn, two ledger
    writes, the reply); ``procledger stop`` and a stop request written to the ledger followed
    by the socket's ``stop`` order, each until the child has exited (its pidfd readable). Each
    child runs ``SETTLE_S`` before its stop.
    Beside them ``subprocess.Popen`` and SIGINT, and supervisord's ``supervisorctl
    start|stop`` and its XML-RPC ``startProcess``/``stopProcess`` over its Unix socket.
(d) Crash drill: ``--children`` Perl children each print a numbered line every 100 ms to the
    stdout file the agent opened for them, and append it to a copy of their own; half end with
    exit 7 during the drill (told to by a file, some while the agent is dead). The agent is
    killed (SIGKILL) ``--kills`` times at random moments -- a quarter of them as soon as its
    socket answers, mid-takeover -- and the anchor once at the end; then the rest are stopped.
    Reported: children that died of it, lines missing from ``procledger logs`` beside the
    copies, exits recorded exactly once with their code, each takeover's time (the agent's own
    report) and the time from the kill to a new agent carrying out orders (the anchor's
    restart backoff, 0.1 s doubling to 5 s, included), and the agent's CPU with the children
    chatty.

``--quick`` is a smoke run of about a minute (counts 1,20,100, 5 s idle, 5 samples, 20
children, 5 kills).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import http.client
import json
import os
import random
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import xmlrpc.client
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from procledger import TerminalReason, open_registry
from procledger.agent.host import AGENT_TIMINGS
from procledger.agent.launch import ask, ensure_agent
from procledger.agent.places import AgentPlaces
from procledger.application.output import read_output
from procledger.application.registry import ProcessRegistry
from procledger.domain.errors import AgentSocketError
from procledger.supervisor.minting import new_process_id
from procledger.supervisor.os_seam import proc_stat

CLI = [sys.executable, "-m", "procledger"]
ISSUE_PER_CHILD_MB = 45.0
"""Issue 28: the detached per-child supervisor of afd535a, 45 MB RSS per child (PSS 31.6)."""
TARGET_TOTAL_MB = 80.0
TARGET_IDLE_PCT = 1.0
TARGET_P50_MS = 100.0
TARGET_TAKEOVER_S = 2.0
READY_PROBE = "benchmark-ready-probe"
"""A ``stop`` order waits for the agent's takeover before it is carried out: its answer says
the agent is ready for orders (the id names no process; looking for requests is harmless)."""
CHILD = r"""
$| = 1;
my ($copy, $trigger) = @ARGV;
open(my $c, ">>", $copy) or die "copy: $!";
select((select($c), $| = 1)[0]);
for (my $n = 1; ; $n++) {
    print "$n\n";
    print $c "$n\n";
    if (-e $trigger) { print $c "exit 7\n"; exit 7 }
    select(undef, undef, undef, 0.1);
}
"""
SETTLE_S = 0.05
"""How long each child of (c) runs before it is stopped: supervisord loses a SIGTERM sent in
the first milliseconds (its forked child has not yet exec'd and still runs supervisord's own
handler), and its stop then waits ``stopwaitsecs`` (10 s) for the SIGKILL."""
TERMINAL_KINDS = frozenset({"completed", "lost", "abandoned"})

# -- processes, by exact pid -----------------------------------------------------------------------


@dataclass(frozen=True)
class Pid:
    """One process for good: its pid and its ``/proc`` start time."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> Pid | None:
        stat = proc_stat(pid)
        return None if stat is None else cls(pid, stat[1])

    def alive(self) -> bool:
        stat = proc_stat(self.pid)
        return stat is not None and stat[1] == self.start and stat[0] != "Z"

    def pidfd(self) -> int | None:
        """A pidfd on this very process, or None when it is gone (or its pid is another's)."""
        try:
            fd = os.pidfd_open(self.pid)
        except OSError:
            return None
        stat = proc_stat(self.pid)
        if stat is None or stat[1] != self.start:
            os.close(fd)
            return None
        return fd

    def kill(self, sig: int = signal.SIGKILL) -> bool:
        fd = self.pidfd()
        if fd is None:
            return False
        try:
            signal.pidfd_send_signal(fd, sig)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)


def wait_exit(fd: int, timeout: float) -> float | None:
    """``perf_counter`` when the process of pidfd ``fd`` exited, or None after ``timeout``."""
    readable, _, _ = select.select([fd], [], [], timeout)
    return time.perf_counter() if readable else None


def memory(pid: int) -> tuple[int, int]:
    """RSS and PSS of ``pid``, bytes (0, 0 when it is gone)."""
    found = {"Rss:": 0, "Pss:": 0}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            name, _, rest = line.partition(" ")
            if name in found:
                found[name] = int(rest.split()[0]) * 1024
    return found["Rss:"], found["Pss:"]


def median_memory(pids: Sequence[int], readings: int = 5) -> list[tuple[float, float]]:
    """Per pid, the median RSS and PSS (MB) of ``readings`` readings 0.2 s apart."""
    seen: list[list[tuple[int, int]]] = [[] for _ in pids]
    for reading in range(readings):
        if reading:
            time.sleep(0.2)
        for index, pid in enumerate(pids):
            seen[index].append(memory(pid))
    return [
        (statistics.median(r for r, _ in each) / 1e6, statistics.median(p for _, p in each) / 1e6)
        for each in seen
    ]


def cpu_seconds(pid: int) -> float | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu(pids: dict[str, list[int]], seconds: float) -> dict[str, float | None]:
    """% of one core each named group of pids spent over the same ``seconds``."""
    before = {name: [cpu_seconds(p) for p in group] for name, group in pids.items()}
    began = time.monotonic()
    time.sleep(seconds)
    took = time.monotonic() - began
    result: dict[str, float | None] = {}
    for name, group in pids.items():
        after = [cpu_seconds(p) for p in group]
        spent = [b - a for a, b in zip(before[name], after, strict=True) if a and b]
        result[name] = sum(spent) / took * 100 if len(spent) == len(group) else None
    return result


def quantiles(samples: Sequence[float]) -> tuple[float, float]:
    """p50 and p90, in ms."""
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, max(0, round(0.9 * len(ordered)) - 1))]
    return statistics.median(ordered) * 1e3, p90 * 1e3


# -- a sandboxed agent -----------------------------------------------------------------------------


class Sandbox:
    """A private state and runtime folder, a SQLite ledger, and the agent of that ledger;
    everything started in it killed by exact pid on the way out."""

    def __init__(self, name: str) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=f"plbench-{name}-", dir="/tmp"))
        for folder in ("state", "run"):
            (self.root / folder).mkdir(mode=0o700)
        self.url = f"sqlite:///{self.root / 'ledger.db'}"
        self.overrides = {
            "XDG_STATE_HOME": str(self.root / "state"),
            "XDG_RUNTIME_DIR": str(self.root / "run"),
            "PROCLEDGER_URL": self.url,
        }
        self._saved = {name: os.environ.get(name) for name in self.overrides}
        self.places: AgentPlaces | None = None
        self.ids: list[str] = []
        self.agents: list[Pid] = []  # every agent and anchor seen, for the cleanup
        self.anchor: Pid | None = None
        self.extra: list[Pid] = []
        self.started: list[float] = []  # when each batch of starts began and ended
        self._registry: ProcessRegistry | None = None

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, **self.overrides}

    def __enter__(self) -> Sandbox:
        os.environ.update(self.overrides)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.kill_all()
        finally:
            if self._registry is not None:
                self._registry.close()
            for name, value in self._saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            shutil.rmtree(self.root, ignore_errors=True)

    @property
    def registry(self) -> ProcessRegistry:
        if self._registry is None:
            self._registry = open_registry(self.url)
        return self._registry

    # -- the agent

    def start_agent(self) -> dict[str, Any]:
        self.places, _ = ensure_agent(self.url)
        self.anchor = Pid.of(int(self.places.anchor_pidfile.read_text()))
        if self.anchor is not None:
            self.agents.append(self.anchor)
        return self.wait_ready()

    def ask(self, doc: dict[str, Any], timeout: float = 30.0) -> Any:
        assert self.places is not None
        return ask(self.places, doc, timeout=timeout)

    def answers(self) -> bool:
        try:
            self.ask({"op": "ping"}, timeout=1.0)
        except (AgentSocketError, OSError):
            return False
        return True

    def wait_ready(self, timeout: float = 60.0, *, early: bool = False) -> dict[str, Any]:
        """Until an agent carries out orders, then its status; with ``early``, only until its
        socket answers (it listens before its takeover ends), then its ``ping``: its pid. Notes
        the pid for the cleanup."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if early:
                    answer: dict[str, Any] = self.ask({"op": "ping"}, timeout=5.0)
                else:
                    self.ask({"op": "stop", "process_id": READY_PROBE}, timeout=timeout)
                    answer = self.ask({"op": "status"}, timeout=timeout)
                break
            except (AgentSocketError, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        agent = Pid.of(answer["pid"])
        if agent is not None and agent not in self.agents:
            self.agents.append(agent)
        return answer

    def start(self, argvs: Sequence[list[str]], threads: int = 8) -> list[str]:
        """Each command started through the agent's socket, ``threads`` orders at a time; the
        ids, in order."""

        def one(argv: list[str]) -> str:
            process_id = new_process_id(int(time.time() * 1000))
            self.ids.append(process_id)
            answer = self.ask(order(argv, process_id, self.env), timeout=120.0)
            if "spawn_error" in answer:
                raise RuntimeError(f"{argv}: {answer['spawn_error']}")
            return process_id

        self.started.append(time.monotonic())
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            started = list(pool.map(one, argvs))
        self.started.append(time.monotonic())
        return started

    def child(self, process_id: str) -> Pid:
        facts = self.registry.get(process_id).os
        assert facts is not None, f"{process_id} has no pid"
        return Pid(facts.pid, int(facts.start_time))

    def kill_all(self) -> None:
        """The anchor first (it would start the agent again), every agent seen, whatever runs
        below the anchor, then every child the ledger names and every other process noted."""
        for pidfile in (self.root / "state").glob("procledger/agent/*/anchor.pid"):
            with contextlib.suppress(OSError, ValueError):
                pid = Pid.of(int(pidfile.read_text()))
                if pid is not None and pid not in self.agents and started_here(pid, self):
                    self.agents.insert(0, pid)
        below = [Pid.of(p) for a in self.agents if a.alive() for p in descendants(a.pid)]
        for process in [*self.agents, *(b for b in below if b is not None)]:
            process.kill()
        children: list[Pid] = []
        if self.ids and (self.root / "ledger.db").exists():
            for process_id in self.ids:
                with contextlib.suppress(Exception):
                    children.append(self.child(process_id))
        for process in [*children, *self.extra]:
            process.kill()


def started_here(process: Pid, box: Sandbox) -> bool:
    """Whether ``process`` runs with this sandbox's state folder (a pid file read at the end
    may name a stranger by now)."""
    try:
        environ = Path(f"/proc/{process.pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"XDG_STATE_HOME={box.overrides['XDG_STATE_HOME']}".encode() in environ


def order(argv: list[str], process_id: str, env: dict[str, str]) -> dict[str, Any]:
    """The agent's ``start`` order, as ``run --background`` sends it (``start_order``)."""
    return {
        "op": "start",
        "argv": argv,
        "process_id": process_id,
        "cwd": os.getcwd(),
        "env": env,
        "stdin": "null",
    }


def descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


# -- supervisord -----------------------------------------------------------------------------------


class UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=60)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(60)
        sock.connect(self.unix_path)
        self.sock = sock


class UnixTransport(xmlrpc.client.Transport):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.unix_path = path

    def make_connection(self, host: Any) -> http.client.HTTPConnection:
        return UnixHTTP(self.unix_path)


class Supervisord:
    """supervisord in the foreground, ``programs`` programs of ``sleep 3600`` (``startsecs=0``:
    running once spawned, as procledger records it) and one more, ``lat``, not started."""

    def __init__(self, bindir: Path, programs: int) -> None:
        self.bindir, self.programs = bindir, programs
        self.root = Path(tempfile.mkdtemp(prefix="plbench-supervisord-", dir="/tmp"))
        self.sock = self.root / "supervisor.sock"
        self.conf = self.root / "supervisord.conf"
        self.conf.write_text(self._config())
        self.children: list[Pid] = []
        with open(self.root / "out.log", "wb") as out:
            self.proc = subprocess.Popen(
                [str(bindir / "supervisord"), "-n", "-c", str(self.conf)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.rpc = xmlrpc.client.ServerProxy("http://localhost", UnixTransport(str(self.sock)))
        self._await_running()

    def _config(self) -> str:
        head = f"""[unix_http_server]
file={self.sock}
[supervisord]
logfile={self.root}/supervisord.log
pidfile={self.root}/supervisord.pid
childlogdir={self.root}
nodaemon=true
minfds=8192
user={_user()}
[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface
[supervisorctl]
serverurl=unix://{self.sock}
[program:lat]
command=sleep 3600
startsecs=0
autostart=false
autorestart=false
"""
        program = "[program:s{0:04d}]\ncommand=sleep 3600\nstartsecs=0\nautorestart=false\n"
        return head + "".join(program.format(n) for n in range(self.programs))

    def _await_running(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"supervisord exited: {(self.root / 'out.log').read_text()}")
            try:
                infos = self.rpc.supervisor.getAllProcessInfo()
            except (OSError, xmlrpc.client.Error, http.client.HTTPException):
                time.sleep(0.1)
                continue
            running = [i for i in infos if i["statename"] == "RUNNING"]
            if len(running) == self.programs:
                self.children = [p for i in running if (p := Pid.of(i["pid"])) is not None]
                return
            time.sleep(0.2)
        raise RuntimeError(f"supervisord did not start {self.programs} programs in {timeout} s")

    def ctl(self, *args: str) -> None:
        argv = [str(self.bindir / "supervisorctl"), "-c", str(self.conf), *args]
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)

    def lat_pid(self) -> Pid:
        pid = Pid.of(self.rpc.supervisor.getProcessInfo("lat")["pid"])
        assert pid is not None
        self.children.append(pid)
        return pid

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.rpc.supervisor.shutdown()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for child in self.children:
            child.kill()
        shutil.rmtree(self.root, ignore_errors=True)


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def venv_with(folder: Path, *requirements: str) -> Path | None:
    """``folder``/bin of a venv with ``requirements`` (made the first time), or None."""
    bindir = folder / "bin"
    if (folder / ".complete").exists():
        return bindir
    try:
        subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
        pip = [str(bindir / "pip"), "install", "-q", *requirements]
        subprocess.run(pip, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.CalledProcessError) as error:
        print(f"    ({' '.join(requirements)} could not be installed: {error})")
        shutil.rmtree(folder, ignore_errors=True)
        return None
    (folder / ".complete").touch()
    return bindir


# -- (a) memory and (b) idle -----------------------------------------------------------------------


@dataclass
class Results:
    """Every figure, for the table at the end."""

    memory: list[tuple[int, float, float, float, float, float]] = field(default_factory=list)
    """(children, agent RSS, agent PSS, anchor RSS, anchor PSS, seconds to start them)."""
    supervisord: list[tuple[int, float, float]] = field(default_factory=list)
    before: dict[str, float] = field(default_factory=dict)
    idle: dict[str, float | None] = field(default_factory=dict)
    idle_children: int = 0
    latency: dict[str, tuple[float, float]] = field(default_factory=dict)
    drill: dict[str, Any] = field(default_factory=dict)


def agent_memory(box: Sandbox, counts: Sequence[int], results: Results) -> None:
    status = box.start_agent()
    anchor = status["anchor_pid"]
    print(f"(a) memory: agent pid {status['pid']}, anchor pid {anchor}; children started")
    print("    through the socket, 8 orders at a time")
    have = 0
    for count in counts:
        began = time.perf_counter()
        box.start([["sleep", "3600"]] * (count - have))
        took = time.perf_counter() - began
        have = count
        time.sleep(1.0)  # let the last replies' writes and the follower settle
        status = box.ask({"op": "status"})
        assert status["children"] == count, status
        (agent_rss, agent_pss), (anchor_rss, anchor_pss) = median_memory([status["pid"], anchor])
        results.memory.append((count, agent_rss, agent_pss, anchor_rss, anchor_pss, took))
        print(
            f"    {count:5d} children: agent RSS {agent_rss:6.1f} MB PSS {agent_pss:6.1f} MB"
            f"   anchor RSS {anchor_rss:5.1f} MB PSS {anchor_pss:5.1f} MB"
            f"   total RSS {agent_rss + anchor_rss:6.1f} MB   (started in {took:5.1f} s)"
        )


def supervisord_memory(bindir: Path, counts: Sequence[int], results: Results) -> Supervisord:
    """supervisord at each count (a fresh one each time); the last is left running."""
    print("    supervisord, a fresh one with each count of programs:")
    daemon: Supervisord | None = None
    for count in counts:
        if daemon is not None:
            daemon.close()
        began = time.perf_counter()
        daemon = Supervisord(bindir, count)
        took = time.perf_counter() - began
        ((rss, pss),) = median_memory([daemon.proc.pid])
        results.supervisord.append((count, rss, pss))
        print(
            f"    {count:5d} programs: supervisord RSS {rss:6.1f} MB PSS {pss:6.1f} MB"
            f"   (up with all running in {took:5.1f} s)"
        )
    assert daemon is not None
    return daemon


def idle(box: Sandbox, daemon: Supervisord | None, seconds: float, results: Results) -> None:
    status = box.ask({"op": "status"})
    groups = {"agent": [status["pid"]], "anchor": [status["anchor_pid"]]}
    if daemon is not None:
        groups["supervisord"] = [daemon.proc.pid]
    results.idle_children = status["children"]
    began = time.monotonic()
    results.idle.update(idle_cpu(groups, seconds))
    shown = "   ".join(f"{name} {pct_text(pct)}" for name, pct in results.idle.items())
    print(f"(b) idle, {status['children']} children, {seconds:g} s: {shown} of one core")
    period = AGENT_TIMINGS.renew_ms / 1000
    first, last = box.started[0] + period, box.started[-1] + period  # the first renewal round
    holds = "all" if began <= first and last <= began + seconds else "none"
    if holds == "none" and ((began < last and first < began + seconds) or seconds >= period):
        holds = "some"
    print(f"    (lease renewals, every {period:g} s per child: {holds} of a round in the window)")


def pct_text(pct: float | None) -> str:
    return "gone" if pct is None else f"{pct:.2f}%"


# -- (c) start to running, stop to gone ------------------------------------------------------------


class Way:
    """One way of starting a ``sleep 3600`` (``start``: returns once it runs) and of stopping
    it (``stop``: asks; the caller waits for the exit), named for the table."""

    start_name = stop_name = ""

    def start(self) -> Pid:
        raise NotImplementedError

    def stop(self, child: Pid) -> object:
        raise NotImplementedError


class AgentCli(Way):
    start_name = stop_name = "procledger CLI"

    def __init__(self, box: Sandbox) -> None:
        self.box, self.ids = box, dict[Pid, str]()

    def start(self) -> Pid:
        out = subprocess.run(
            [*CLI, "run", "--background", "--", "sleep", "3600"],
            env=self.box.env, check=True, capture_output=True, text=True,
        )  # fmt: skip
        return self.noted(out.stdout.strip())

    def noted(self, process_id: str) -> Pid:
        if process_id not in self.box.ids:
            self.box.ids.append(process_id)
        child = self.box.child(process_id)
        self.ids[child] = process_id
        return child

    def stop(self, child: Pid) -> object:
        argv = [*CLI, "stop", self.ids.pop(child)]
        return subprocess.Popen(argv, env=self.box.env, stdout=subprocess.DEVNULL)


class AgentSocket(AgentCli):
    start_name, stop_name = "agent socket", "ledger + socket"

    def start(self) -> Pid:
        (process_id,) = self.box.start([["sleep", "3600"]], threads=1)
        return self.noted(process_id)

    def stop(self, child: Pid) -> object:
        process_id = self.ids.pop(child)
        self.box.registry.request_stop(process_id, TerminalReason.interrupted)
        return self.box.ask({"op": "stop", "process_id": process_id})


class Supervisorctl(Way):
    start_name = stop_name = "supervisorctl"

    def __init__(self, daemon: Supervisord) -> None:
        self.daemon = daemon

    def start(self) -> Pid:
        self.daemon.ctl("start", "lat")
        return self.daemon.lat_pid()

    def stop(self, child: Pid) -> object:
        self.daemon.ctl("stop", "lat")
        return None


class SupervisorRpc(Supervisorctl):
    start_name = stop_name = "supervisord XML-RPC"

    def start(self) -> Pid:
        self.daemon.rpc.supervisor.startProcess("lat", True)
        return self.daemon.lat_pid()

    def stop(self, child: Pid) -> object:
        return self.daemon.rpc.supervisor.stopProcess("lat", True)


class Popen(Way):
    start_name, stop_name = "subprocess.Popen", "SIGINT"

    def __init__(self, box: Sandbox) -> None:
        self.box, self.procs = box, dict[Pid, subprocess.Popen[bytes]]()

    def start(self) -> Pid:
        proc = subprocess.Popen(["sleep", "3600"])
        child = Pid.of(proc.pid)
        assert child is not None
        self.procs[child] = proc
        self.box.extra.append(child)
        return child

    def stop(self, child: Pid) -> object:
        os.kill(child.pid, signal.SIGINT)
        return self.procs.pop(child)


def latency(box: Sandbox, daemon: Supervisord | None, samples: int, results: Results) -> None:
    """Each way of starting then stopping one ``sleep``, in turn, ``samples`` times after two
    rounds of warm-up."""
    ways: list[Way] = [AgentCli(box), AgentSocket(box)]
    if daemon is not None:
        ways += [Supervisorctl(daemon), SupervisorRpc(daemon)]
    ways.append(Popen(box))
    times: dict[str, list[float]] = {}
    for round_ in range(samples + 2):
        for way in ways:
            began = time.perf_counter()
            child = way.start()
            took_start = time.perf_counter() - began
            time.sleep(SETTLE_S)
            took_stop = until_gone(child, functools.partial(way.stop, child))
            if round_ >= 2:
                times.setdefault(f"start: {way.start_name}", []).append(took_start)
                times.setdefault(f"stop: {way.stop_name}", []).append(took_stop)
    status = box.ask({"op": "status"})
    print(
        f"(c) start to running and stop to gone, {samples} samples each, p50 / p90 "
        f"({status['children']} idle children beside it):"
    )
    for name, samples_of in times.items():
        results.latency[name] = quantiles(samples_of)
        p50, p90 = results.latency[name]
        print(f"    {name:<32} {p50:8.1f} ms {p90:8.1f} ms")


def until_gone(child: Pid, stop: Callable[[], object], timeout: float = 30.0) -> float:
    """Seconds from calling ``stop`` until ``child`` has exited."""
    fd = child.pidfd()
    assert fd is not None, f"{child} is not running"
    try:
        began = time.perf_counter()
        done = stop()
        ended = wait_exit(fd, timeout)
        if isinstance(done, subprocess.Popen):
            done.wait()
        if ended is None:
            raise RuntimeError(f"{child} still runs {timeout} s after its stop")
        return ended - began
    finally:
        os.close(fd)


# -- the detached per-child supervisor of afd535a -------------------------------------------------


def before(bindir: Path, children: int, idle_s: float, results: Results) -> None:
    """``children`` background sleeps under the old CLI: each supervisor's memory and idle CPU,
    start (the CLI's wall time: it returns once running is recorded) and stop to gone."""
    cli = [str(bindir / "procledger")]
    with Sandbox("before") as box:
        box.overrides["PYTHONPATH"] = ""  # its own procledger, not src/
        pairs: list[tuple[str, Pid, Pid]] = []
        starts, stops = [], []
        try:
            for _ in range(children):
                began = time.perf_counter()
                out = subprocess.run(
                    [*cli, "run", "--background", "--", "sleep", "3600"],
                    env=box.env, check=True, capture_output=True, text=True,
                )  # fmt: skip
                starts.append(time.perf_counter() - began)
                process_id = out.stdout.strip()
                shown = subprocess.run(
                    [*cli, "show", process_id, "--json"],
                    env=box.env, check=True, capture_output=True, text=True,
                )  # fmt: skip
                record = json.loads(shown.stdout)["record"]
                child = Pid(record["os"]["pid"], record["os"]["start_time"])
                holder = Pid.of(record["first_started"]["owner"]["liveness"]["pid"])
                assert holder is not None
                box.extra += [holder, child]
                pairs.append((process_id, holder, child))
            time.sleep(1.0)
            mems = median_memory([holder.pid for _, holder, _ in pairs])
            cpu = idle_cpu({"all": [holder.pid for _, holder, _ in pairs]}, idle_s)["all"]
            for process_id, _, child in pairs:
                argv = [*cli, "stop", process_id]
                stops.append(
                    until_gone(
                        child,
                        lambda a=argv: subprocess.Popen(a, env=box.env, stdout=subprocess.DEVNULL),
                    )
                )
        finally:
            box.kill_all()
    rss = statistics.median(r for r, _ in mems)
    pss = statistics.median(p for _, p in mems)
    results.before = {
        "rss": rss,
        "pss": pss,
        "cpu": (cpu or 0.0) / children,
        "start": quantiles(starts)[0],
        "stop": quantiles(stops)[0],
        "children": children,
    }
    print(
        f"    afd535a, {children} background sleeps, one detached supervisor each: RSS "
        f"{rss:5.1f} MB PSS {pss:5.1f} MB per child, idle {pct_text(cpu and cpu / children)} "
        f"per child; start {results.before['start']:6.0f} ms, stop to gone "
        f"{results.before['stop']:6.0f} ms (medians)"
    )


# -- (d) the crash drill ---------------------------------------------------------------------------


class Drill:
    """The crash drill in one sandbox: its children, which of them exit 7 and when, the kills,
    and what the ledger says at the end."""

    def __init__(self, box: Sandbox, children: int, kills: int, seed: int) -> None:
        self.box, self.kills, self.rng = box, kills, random.Random(seed)
        self.copies, self.triggers = box.root / "copies", box.root / "triggers"
        self.copies.mkdir()
        self.triggers.mkdir()
        shuffled = list(range(children))
        self.rng.shuffle(shuffled)
        self.exiting = sorted(shuffled[: children // 2])
        self.staying = sorted(shuffled[children // 2 :])
        self.groups = [self.exiting[k::kills] for k in range(kills)]
        self.ids: list[str] = []
        self.pids: list[Pid] = []
        self.report: dict[str, Any] = {"children": children, "kills": kills, "early": 0}

    def start(self) -> None:
        self.box.start_agent()
        argvs = [
            ["perl", "-e", CHILD, str(self.copies / str(n)), str(self.triggers / str(n))]
            for n in range(self.report["children"])
        ]
        began = time.perf_counter()
        self.ids = self.box.start(argvs)
        self.pids = [self.box.child(process_id) for process_id in self.ids]
        print(
            f"(d) crash drill: {len(self.ids)} children started in "
            f"{time.perf_counter() - began:.1f} s; {self.kills} agent kills, then the anchor"
        )
        pid = self.box.ask({"op": "status"})["pid"]
        self.report["cpu"] = cpu = idle_cpu({"agent": [pid]}, 5.0)["agent"]
        print(f"    agent CPU with {len(self.ids)} chatty children: {pct_text(cpu)} of one core")

    def kill_agents(self) -> None:
        """Each kill at a random moment: up to 2 s after the agent is ready, or (a quarter)
        as soon as its socket answers; each group of exits told before the kill or just
        after it (while no agent runs)."""
        cycles = self.report["cycles"] = []
        early = False  # the agent now running was awaited only until its socket answered
        for k in range(self.kills):
            while_dead = self.rng.random() < 0.5
            delay = 0.0 if early else self.rng.uniform(0.0, 2.0)
            time.sleep(delay / 2)
            if not while_dead:
                self.trigger(self.groups[k])
            time.sleep(delay / 2)
            agent = self.box.agents[-1]  # the one wait_ready saw last
            agent.kill()
            killed_at = time.perf_counter()
            if while_dead:
                self.trigger(self.groups[k])
            early = k + 1 < self.kills and self.rng.random() < 0.25
            self.report["early"] += early
            new = self.box.wait_ready(early=early)
            if not early:
                cycles.append((time.perf_counter() - killed_at, new["takeover"]["seconds"]))
            assert new["pid"] != agent.pid

    def trigger(self, group: list[int]) -> None:
        for n in group:
            (self.triggers / str(n)).touch()

    def end(self) -> None:
        """Once every exit 7 is over and recorded: kill the anchor, then stop the rest."""
        box, report = self.box, self.report
        box.wait_ready()
        report["exits_gone"] = wait_until_all(
            lambda: not any(self.pids[n].alive() for n in self.exiting), 20
        )
        report["exits_recorded"] = self.all_recorded(self.exiting, 30)
        status = box.ask({"op": "status"})
        report["stayed_alive"] = sum(self.pids[n].alive() for n in self.staying)
        report["strangers"] = status["children"] - report["stayed_alive"]
        anchor = Pid.of(status["anchor_pid"])
        assert anchor is not None
        anchor.kill()
        time.sleep(2.0)
        report["alive_after_anchor"] = sum(self.pids[n].alive() for n in self.staying)
        for n in self.staying:
            box.registry.request_stop(self.ids[n], TerminalReason.interrupted)
        with contextlib.suppress(AgentSocketError, OSError):
            box.ask({"op": "stop", "process_id": self.ids[self.staying[0]]})
        report["stopped_recorded"] = self.all_recorded(self.staying, 60)

    def all_recorded(self, which: list[int], timeout: float) -> bool:
        registry = self.box.registry
        return wait_until_all(
            lambda: all(registry.get(self.ids[n]).is_terminal for n in which), timeout
        )


def drill(children: int, kills: int, seed: int, results: Results) -> None:
    with Sandbox("drill") as box:
        run = Drill(box, children, kills, seed)
        run.start()
        run.kill_agents()
        run.end()
        report = run.report
        report.update(settle(box, run.ids, run.exiting, run.copies))
        report["died"] = report["untold"] + len(run.staying) - report["alive_after_anchor"]
        results.drill = report
        print_drill(report)


def wait_until_all(done: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def settle(box: Sandbox, ids: list[str], exiting: list[int], copies: Path) -> dict[str, Any]:
    """What the ledger and the output files say beside each child's own copy."""
    missing = extra = untold = not_once = wrong_code = lines = 0
    states: dict[str, int] = {}
    for n, process_id in enumerate(ids):
        copy = (copies / str(n)).read_text().splitlines()
        told = copy[-1:] == ["exit 7"]
        written = copy[:-1] if told else copy
        shown = logged(box, process_id).decode().splitlines()
        lines += len(written)
        missing += len(set(written) - set(shown))
        extra += max(0, len(shown) - len(written))
        record = box.registry.get(process_id)
        kinds = [e.kind for e in box.registry.events(process_id) if e.kind in TERMINAL_KINDS]
        not_once += len(kinds) != 1
        how = record.exit_code if record.exit_code is not None else record.reason
        state = f"{record.state.value}/{getattr(how, 'value', how)}"
        states[state] = states.get(state, 0) + 1
        if n in exiting:
            untold += not told
            wrong_code += record.exit_code != 7
    cli_same = True
    for process_id in ids[:3]:
        argv = [*CLI, "logs", process_id, "--stream", "stdout"]
        shown_by_cli = subprocess.run(argv, env=box.env, check=True, capture_output=True).stdout
        cli_same = cli_same and shown_by_cli == logged(box, process_id)
    return {
        "missing": missing,
        "extra": extra,
        "untold": untold,
        "not_once": not_once,
        "wrong_code": wrong_code,
        "exiting": len(exiting),
        "states": states,
        "cli_same": cli_same,
        "lines": lines,
    }


def logged(box: Sandbox, process_id: str) -> bytes:
    """What ``procledger logs ID --stream stdout`` prints, read the way it reads it."""
    return b"".join(c.data for c in read_output(box.registry, process_id, stream="stdout"))


def print_drill(r: dict[str, Any]) -> None:
    walls = [c[0] for c in r["cycles"]]
    takeovers = [c[1] for c in r["cycles"]]
    print(
        f"    {r['kills']} agent kills ({r['early']} mid-takeover), anchor killed at the end; "
        f"{r['lines']} lines written by the children"
    )
    print(
        f"    children that died of it: {r['died']}   lines missing from logs: {r['missing']}"
        f" (in logs only: {r['extra']}, a stop between a child's two writes; `procledger logs`"
        f" = library read: {r['cli_same']})"
    )
    print(
        f"    exit 7 recorded with its code: {r['exiting'] - r['wrong_code']}/{r['exiting']}   "
        f"processes without exactly one terminal event: {r['not_once']}   states: {r['states']}"
    )
    print(
        f"    takeover (agent's report) max {max(takeovers):.3f} s median "
        f"{statistics.median(takeovers):.3f} s; kill to orders carried out max "
        f"{max(walls):.2f} s median {statistics.median(walls):.2f} s (backoff included)"
    )
    print(
        f"    held but not our live children (pid reuse): {r['strangers']}; staying children "
        f"alive before the anchor's kill {r['stayed_alive']}, 2 s after it "
        f"{r['alive_after_anchor']}"
    )


# -- the table -------------------------------------------------------------------------------------


def table(results: Results) -> None:
    print("\nsummary")
    if results.memory:
        first, last = results.memory[0], results.memory[-1]
        total = last[1] + last[3]
        per = (total - first[1] - first[3]) / max(1, last[0] - first[0]) * 1e3
        old = results.before.get("rss")
        old_text = f"{old:.1f} MB (afd535a, this run)" if old else f"{ISSUE_PER_CHILD_MB:g} MB"
        if not old:
            old_text += " (issue 28, measured earlier)"
        mark = "ok" if total <= TARGET_TOTAL_MB else "OVER"
        print(
            f"  memory at {last[0]}: agent+anchor RSS {total:.1f} MB (target <= "
            f"{TARGET_TOTAL_MB:g}: {mark}), PSS {last[2] + last[4]:.1f} MB; per extra child "
            f"{per:.1f} KB RSS; per child before: {old_text}"
        )
        if results.supervisord:
            count, rss, pss = results.supervisord[-1]
            s_per = (rss - results.supervisord[0][1]) / max(1, count - results.supervisord[0][0])
            print(
                f"  supervisord at {count}: RSS {rss:.1f} MB, PSS {pss:.1f} MB, per extra "
                f"program {s_per * 1e3:.1f} KB; agent+anchor / supervisord "
                f"{total / rss:.2f}x"
            )
    if results.idle:
        agent = results.idle.get("agent")
        mark = "ok" if agent is not None and agent < TARGET_IDLE_PCT else "OVER"
        shown = ", ".join(f"{k} {pct_text(v)}" for k, v in results.idle.items())
        print(f"  idle CPU at {results.idle_children}: {shown} (agent target < 1%: {mark})")
    if results.latency:
        for name, (p50, p90) in results.latency.items():
            print(f"  {name:<34} p50 {p50:7.1f} ms  p90 {p90:7.1f} ms")
        for name in ("start: agent socket", "stop: ledger + socket"):
            if name in results.latency:
                mark = "ok" if results.latency[name][0] <= TARGET_P50_MS else "OVER"
                print(f"  the agent's own part, {name}: p50 <= {TARGET_P50_MS:g} ms: {mark}")
    if results.drill:
        r = results.drill
        takeover = max(c[1] for c in r["cycles"])
        print(
            f"  drill ({r['children']} children, {r['kills']} kills + anchor): died "
            f"{r['died']}, lines missing {r['missing']}, exits not recorded once with their "
            f"code {r['not_once'] + r['wrong_code']}, takeover max {takeover:.3f} s "
            f"({'ok' if takeover < TARGET_TAKEOVER_S else 'OVER'}), pid-reuse adoptions "
            f"{r['strangers']}"
        )


# -- main ------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of about a minute")
    parser.add_argument("--counts", help="children for (a), comma-separated (1,100,1000)")
    parser.add_argument("--idle", type=float, help="seconds of (b) (30)")
    parser.add_argument("--samples", type=int, help="samples of (c) (20)")
    parser.add_argument("--children", type=int, help="children of the drill (200)")
    parser.add_argument("--kills", type=int, help="agent kills in the drill (20)")
    parser.add_argument("--before", type=Path, help="a checkout of afd535a to measure beside")
    parser.add_argument("--before-children", type=int, default=5)
    parser.add_argument("--no-supervisord", action="store_true")
    parser.add_argument(
        "--baselines", type=Path, default=Path.home() / ".cache" / "procledger-bench",
        help="where the supervisord and afd535a venvs are made (once)",
    )  # fmt: skip
    parser.add_argument("--skip", default="", help="any of memory,latency,before,drill")
    parser.add_argument("--seed", type=int, default=28)
    args = parser.parse_args()
    quick = args.quick
    counts = [int(c) for c in (args.counts or ("1,20,100" if quick else "1,100,1000")).split(",")]
    idle_s = args.idle if args.idle is not None else (5.0 if quick else 30.0)
    samples = args.samples or (5 if quick else 20)
    children = args.children or (20 if quick else 200)
    kills = args.kills or (5 if quick else 20)
    skip = set(filter(None, args.skip.split(",")))
    results = Results()
    began = time.perf_counter()
    supervisord = None
    if not args.no_supervisord and not {"memory", "latency"} <= skip:
        supervisord = venv_with(args.baselines / "supervisor", "supervisor")
    if not {"memory", "latency"} <= skip:
        with Sandbox("agent") as box, contextlib.ExitStack() as stack:
            agent_memory(box, counts, results)
            daemon = None
            if supervisord is not None:
                daemon = supervisord_memory(supervisord, counts, results)
                stack.callback(daemon.close)
            if "memory" not in skip:
                idle(box, daemon, idle_s, results)
            if "latency" not in skip:
                latency(box, daemon, samples, results)
    if args.before and "before" not in skip:
        old = venv_with(args.baselines / "before-afd535a", str(args.before))
        if old is not None:
            before(old, 2 if quick else args.before_children, min(idle_s, 10.0), results)
    if "drill" not in skip:
        drill(children, kills, args.seed, results)
    table(results)
    print(f"  ({time.perf_counter() - began:.0f} s in all)")


if __name__ == "__main__":
    main()
