"""Interactive sessions (issue 31, docs/design.md §20): each figure beside its floor, measured
in the same run, in a sandbox of its own (``XDG_STATE_HOME``/``XDG_RUNTIME_DIR`` in a temporary
folder, a SQLite ledger there); the agent's tree and every session's child are killed by exact
pid at the end.

    PYTHONPATH=src python benchmarks/interactive.py [--quick] [--samples N] [--sessions N]
        [--prompts N] [--quiet-s S] [--skip send,sessions,detect,quiet]

(a) send -> answer: a background ``python3 -q -i`` on a pseudo-terminal; ``--samples`` times the
    agent's ``send`` order (what ``procledger send`` sends, minus the CLI's start-up) with
    ``print(6*N)``, each until its answer is in the run's output file: p50 and p99. Beside it
    the whole CLI (``procledger send``), and the floor: the same REPL on a pseudo-terminal this
    script holds, written and read directly.
(b) ``--sessions`` concurrent sessions (``sh -i`` on a pseudo-terminal each) on one agent, each
    answering a send; the agent's and the anchor's RSS and PSS with them, per session, beside
    the agent holding as many plain ``sleep`` children (issue 28's memory figure's shape).
(c) waiting-for-input detection: ``--prompts`` prompts (``read -p``) in a row; for each, the time
    from the prompt reaching the output file to ``waiting_for_input`` on record: p50, p95. The
    floor: the detector itself (``adapters.input_waits.blocked_reader``) polled every 10 ms from
    here on a terminal this script holds.
(d) false positives: ``sleep``, a busy loop and ``yes > /dev/null`` on pseudo-terminals and on
    stdin pipes for ``--quiet-s`` seconds (600 for the issue's ten minutes): the
    ``waiting_for_input`` facts recorded for them (must be 0).

``--quick``: 30 samples, 20 sessions, 10 prompts, 10 s quiet.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from procledger import open_registry
from procledger.adapters.input_waits import InputSource, blocked_reader
from procledger.agent.launch import ask, ensure_agent
from procledger.agent.places import AgentPlaces
from procledger.supervisor.minting import new_process_id
from procledger.supervisor.terminal import take_terminal

CLI = [sys.executable, "-m", "procledger"]


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] * 1e3


def p50(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


class Sandbox:
    """A ledger, an agent and the sessions it holds, all killed by exact pid at the end."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        (folder / "run").mkdir(mode=0o700)
        os.environ["XDG_STATE_HOME"] = str(folder / "state")
        os.environ["XDG_RUNTIME_DIR"] = str(folder / "run")
        self.url = f"sqlite:///{folder}/ledger.db"
        self.places: AgentPlaces = ensure_agent(self.url)[0]
        self.registry = open_registry(self.url)
        self.pids: list[int] = []

    def start(self, argv: list[str], *, pty: bool = True, stdin: str = "null") -> str:
        process_id = new_process_id(int(time.time() * 1000))
        order = {
            "op": "start", "argv": argv, "process_id": process_id, "cwd": str(self.folder),
            "env": dict(os.environ), "stdin": stdin, "pty": [24, 80] if pty else None,
        }  # fmt: skip
        ask(self.places, order, timeout=60)
        self.pids.append(self.registry.get(process_id).os_pid or 0)
        return process_id

    def send(self, process_id: str, data: bytes) -> None:
        order = {"op": "send", "process_id": process_id, "command_id": os.urandom(8).hex(),
                 "data": base64.b64encode(data).decode()}  # fmt: skip
        ask(self.places, order, timeout=30)

    def stdout(self, process_id: str) -> Path:
        from procledger.adapters.direct_output import stream_paths
        from procledger.adapters.output_files import folder_for, output_root
        from procledger.adapters.sql.location import locate, store_key

        key = store_key(locate(self.url))
        assert key is not None
        return stream_paths(folder_for(output_root(), key, process_id))[0]

    def agent_pids(self) -> tuple[int, int]:
        status = ask(self.places, {"op": "status"}, timeout=10)
        return int(status["pid"]), int(status["anchor_pid"])

    def close(self) -> None:
        pids = list(self.pids)
        with contextlib.suppress(Exception):
            pids += list(self.agent_pids())[::-1]
        for pid in pids:  # each session leads a group of its own: its whole tree goes
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def wait_for(predicate: Any, timeout: float = 30.0, poll: float = 0.0005) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark: a wait ran out")
        time.sleep(poll)


def holds(path: Path, text: bytes, start: int = 0) -> bool:
    with open(path, "rb") as file:
        file.seek(start)
        return text in file.read()


def memory(pid: int) -> tuple[int, int]:
    """RSS and PSS in KiB (``smaps_rollup``)."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value, *_ = line.split()
        fields[name.rstrip(":")] = int(value)
    return fields["Rss"], fields["Pss"]


# -- (a) send -> answer --------------------------------------------------------------------------


def bench_send(box: Sandbox, samples: int) -> None:
    process_id = box.start([sys.executable, "-q", "-i"])
    out = box.stdout(process_id)
    wait_for(lambda: out.exists() and holds(out, b">>> "))
    ours: list[float] = []
    for n in range(samples):
        start = out.stat().st_size
        began = time.perf_counter()
        box.send(process_id, f"print(6*{n + 7})\n".encode())
        answer = f"{6 * (n + 7)}\r\n".encode()
        wait_for(lambda: holds(out, answer, start))  # noqa: B023
        ours.append(time.perf_counter() - began)
    cli: list[float] = []
    for n in range(max(5, samples // 10)):
        start = out.stat().st_size
        began = time.perf_counter()
        subprocess.run([*CLI, "--url", box.url, "send", process_id, f"print(7*{n + 3})", "--line"],
                       check=True, capture_output=True)  # fmt: skip
        answer = f"{7 * (n + 3)}\r\n".encode()
        wait_for(lambda: holds(out, answer, start))  # noqa: B023
        cli.append(time.perf_counter() - began)
    floor = raw_repl(samples)
    print(f"(a) send -> answer, {samples} samples")
    print(f"    agent send order   p50 {p50(ours):6.2f} ms  p99 {percentile(ours, 0.99):6.2f} ms")
    print(f"    procledger send    p50 {p50(cli):6.2f} ms  p99 {percentile(cli, 0.99):6.2f} ms")
    print(f"    raw pty (floor)    p50 {p50(floor):6.2f} ms  p99 {percentile(floor, 0.99):6.2f} ms")
    print(f"    ratio (p50, agent/floor) {p50(ours) / p50(floor):.1f}x")


def raw_repl(samples: int) -> list[float]:
    """The floor: a REPL on a terminal held here, written and read directly."""
    master, child_side = os.openpty()
    child = subprocess.Popen([sys.executable, "-q", "-i"], stdin=child_side, stdout=child_side,
                             stderr=child_side, start_new_session=True)  # fmt: skip
    os.close(child_side)
    try:
        read_until(master, b">>> ")
        times = []
        for n in range(samples):
            began = time.perf_counter()
            os.write(master, f"print(6*{n + 7})\n".encode())
            read_until(master, f"{6 * (n + 7)}\r\n".encode())
            times.append(time.perf_counter() - began)
        return times
    finally:
        child.kill()
        child.wait()
        os.close(master)


def read_until(fd: int, text: bytes) -> None:
    seen = b""
    while text not in seen:
        select.select([fd], [], [], 10)
        seen = (seen + os.read(fd, 65536))[-4096:]


# -- (b) many sessions -----------------------------------------------------------------------


def bench_sessions(box: Sandbox, count: int) -> None:
    agent, anchor = box.agent_pids()
    idle = memory(agent)
    sessions = [box.start(["sh", "-i"]) for _ in range(count)]
    for n, process_id in enumerate(sessions):
        box.send(process_id, f"echo answer-{n}\n".encode())
    for n, process_id in enumerate(sessions):
        wait_for(lambda: holds(box.stdout(process_id), f"answer-{n}\r".encode()), poll=0.005)  # noqa: B023
    held = memory(agent)
    anchored = memory(anchor)
    print(f"(b) {count} concurrent sessions on one agent, each answered a send")
    per_session = (held[0] - idle[0]) / count
    print(f"    agent RSS {held[0] / 1024:6.1f} MiB, PSS {held[1] / 1024:6.1f} MiB "
          f"(idle {idle[0] / 1024:.1f} MiB): {per_session:.0f} KiB a session")  # fmt: skip
    print(f"    anchor RSS {anchored[0] / 1024:.1f} MiB holding {count} terminals")
    for pid in box.pids:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
    wait_for(lambda: box.registry.list_processes({"status": "running"}) == [], 60, 0.05)
    base = memory(agent)
    sleepers = [box.start(["sleep", "3600"], pty=False) for _ in range(count)]
    plain = memory(agent)
    print(f"    beside: {len(sleepers)} plain children add {(plain[0] - base[0]) / count:.0f} KiB "
          "each to the agent's RSS")  # fmt: skip


# -- (c) detection -----------------------------------------------------------------------------


def bench_detect(box: Sandbox, prompts: int) -> None:
    script = f'for i in $(seq {prompts}); do read -p "question $i? " a; done'
    process_id = box.start(["bash", "-c", script])
    out = box.stdout(process_id)
    latencies = []
    for n in range(1, prompts + 1):
        wait_for(lambda: out.exists() and holds(out, f"question {n}? ".encode()))  # noqa: B023
        seen = time.perf_counter()
        wait_for(lambda: box.registry.get(process_id).waiting_for_input is not None, 10, 0.002)
        latencies.append(time.perf_counter() - seen)
        box.send(process_id, b"y\n")
        wait_for(lambda: box.registry.get(process_id).waiting_for_input is None, 10, 0.002)
    floor = raw_detect(script)
    print(f"(c) waiting for input told, {prompts} prompts")
    print(f"    agent (fact on record)  p50 {p50(latencies):6.1f} ms  "
          f"p95 {percentile(latencies, 0.95):6.1f} ms")  # fmt: skip
    print(f"    detector at 10 ms here  p50 {p50(floor):6.1f} ms  "
          f"p95 {percentile(floor, 0.95):6.1f} ms")  # fmt: skip


def raw_detect(script: str) -> list[float]:
    master, child_side = os.openpty()
    child = subprocess.Popen(["bash", "-c", script], stdin=child_side, stdout=child_side,
                             stderr=child_side, start_new_session=True,
                             preexec_fn=take_terminal)  # fmt: skip  # noqa: PLW1509
    os.close(child_side)
    source = InputSource.of_terminal(master)
    times = []
    try:
        while child.poll() is None:
            try:
                read_until(master, b"? ")
            except OSError:
                break
            seen = time.perf_counter()
            while blocked_reader(source, child.pid) is None:
                time.sleep(0.01)
            times.append(time.perf_counter() - seen)
            os.write(master, b"y\n")
    finally:
        child.kill()
        child.wait()
        os.close(master)
    return times


# -- (d) false positives -----------------------------------------------------------------------


def bench_quiet(box: Sandbox, seconds: float) -> None:
    programs = [["sleep", "100000"], [sys.executable, "-c", "while True: pass"],
                ["sh", "-c", "yes > /dev/null"]]  # fmt: skip
    ids = [box.start(argv) for argv in programs]
    ids += [box.start(argv, pty=False, stdin="pipe") for argv in programs]
    time.sleep(seconds)
    found = sum(
        1 for process_id in ids for event in box.registry.events(process_id)
        if event.kind == "waiting_for_input"
    )  # fmt: skip
    print(f"(d) {len(ids)} sessions that never read (sleep, busy loop, yes > /dev/null; terminal "
          f"and pipe) for {seconds:g} s: {found} waiting_for_input facts (must be 0)")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--prompts", type=int, default=50)
    parser.add_argument("--quiet-s", type=float, default=600.0)
    parser.add_argument("--skip", default="")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.sessions, args.prompts, args.quiet_s = 30, 20, 10, 10.0
    skip = set(args.skip.split(",")) - {""}
    with tempfile.TemporaryDirectory(prefix="procledger-interactive-") as folder:
        box = Sandbox(Path(folder))
        try:
            if "send" not in skip:
                bench_send(box, args.samples)
            if "sessions" not in skip:
                bench_sessions(box, args.sessions)
            if "detect" not in skip:
                bench_detect(box, args.prompts)
            if "quiet" not in skip:
                bench_quiet(box, args.quiet_s)
        finally:
            box.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
