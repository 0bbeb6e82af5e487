"""Output capture (issue 15), side by side in one run.

- A child writing ``--gib`` GiB to stdout under `procledger run` (foreground, capture on, the
  terminal side sent to /dev/null) beside the same child with stdout redirected to a file by the
  shell: wall time (target ≤ 1.5×) and the supervisor's peak RSS (target ≤ 100 MB). A shared,
  noisy machine moves single figures by 2×, so ``--rounds`` rounds each run both (which goes
  first alternates), after an unmeasured ``sync`` so no run pays for the previous one's
  writeback; the figures are the medians, the range of the per-round ratios, the best-of-rounds
  ratio (the runs the neighbours' load hit least) and the CPU seconds each side spent.
- The same child under ``Supervisor.start`` in this process, from ``start`` to ``wait`` (our
  stdout on /dev/null meanwhile): the capture itself, without the CLI's ~0.4 s of Python
  start-up (imports; see benchmarks/startup.py), which alone is 0.4× of a 1 GiB shell run.
- ``follow_output`` latency from the child's write to the reader: p95 (target < 200 ms).
- `procledger run -- true` with capture on beside ``--no-capture``: medians (target ≤ 1.1×).

    PYTHONPATH=src python benchmarks/output.py [--gib 1] [--rounds 7] [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

CLI = [sys.executable, "-m", "procledger"]


@dataclass
class Runs:
    """Wall and CPU (user + system, the process and its reaped children) seconds per run."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def add(self, wall: float, cpu: float) -> None:
        self.wall.append(wall)
        self.cpu.append(cpu)


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds and peak RSS (KiB) of ``argv`` and its waited-for children."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, argv
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def _cpu_now() -> float:
    own, reaped = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


def report(label: str, ours: Runs, shell: Runs) -> None:
    """Medians, ranges, the per-round ratios and the best-of-rounds ratio (the run least hit by
    the neighbours' load), and the CPU both spent."""
    ratios = sorted(a / b for a, b in zip(ours.wall, shell.wall, strict=True))
    a, b = statistics.median(ours.wall), statistics.median(shell.wall)
    print(
        f"{label}, {len(ratios)} rounds: shell redirect median {b:.2f} s "
        f"({min(shell.wall):.2f}-{max(shell.wall):.2f}), captured median {a:.2f} s "
        f"({min(ours.wall):.2f}-{max(ours.wall):.2f}); ratio of medians {a / b:.2f}x "
        f"(target <= 1.5x), per round {ratios[0]:.2f}-{ratios[-1]:.2f}x, best of rounds "
        f"{min(ours.wall) / min(shell.wall):.2f}x; CPU median {statistics.median(ours.cpu):.2f} s "
        f"vs {statistics.median(shell.cpu):.2f} s"
    )


def alternate(
    rounds: int, folder: Path, ours: Callable[[], None], shell: Callable[[], None]
) -> None:
    """``rounds`` rounds of both, which one goes first alternating, each after ``_clean``."""
    for round_ in range(rounds):
        for run in (shell, ours) if round_ % 2 == 0 else (ours, shell):
            _clean(folder)
            run()
    _clean(folder)


def bulk(gib: float, rounds: int, url: str, folder: Path, env: dict[str, str]) -> None:
    size = int(gib * 1024**3)
    write = f"head -c {size} /dev/zero"
    shell_argv = ["sh", "-c", f"{write} > {folder}/plain.out"]
    limit = ["--output-limit", str(size + 1024)]
    captured_argv = [*CLI, "--url", url, "run", *limit, "--", "sh", "-c", write]
    shell, captured, rss = Runs(), Runs(), [0]

    def ours() -> None:
        wall, cpu, peak = timed(captured_argv, env)
        captured.add(wall, cpu)
        rss[0] = max(rss[0], peak)

    alternate(rounds, folder, ours, lambda: shell.add(*timed(shell_argv, env)[:2]))
    report(f"{gib:g} GiB to stdout, `procledger run` (CLI)", captured, shell)
    print(f"  supervisor peak RSS {rss[0] / 1024:.0f} MB (target <= 100 MB)")


def library_bulk(gib: float, rounds: int, url: str, folder: Path, env: dict[str, str]) -> None:
    from procledger import LeaseOwner, open_registry
    from procledger.supervisor.supervisor import Supervisor

    size = int(gib * 1024**3)
    shell_argv = ["sh", "-c", f"head -c {size} /dev/zero > {folder}/plain.out"]
    shell, captured = Runs(), Runs()
    registry = open_registry(url)
    saved, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    with Supervisor(registry, owner=LeaseOwner.local_process("bench")) as supervisor:

        def ours() -> None:
            wall, cpu = time.perf_counter(), _cpu_now()
            argv = ["sh", "-c", f"head -c {size} /dev/zero"]
            supervisor.wait(supervisor.start(argv, output_limit=size + 1024))
            captured.add(time.perf_counter() - wall, _cpu_now() - cpu)

        os.dup2(null, 1)  # the live copy goes where `run > /dev/null` sends it
        try:
            alternate(rounds, folder, ours, lambda: shell.add(*timed(shell_argv, env)[:2]))
        finally:
            os.dup2(saved, 1)
            os.close(null)
            os.close(saved)
    registry.close()
    report(f"{gib:g} GiB, Supervisor.start in-process (no CLI start-up)", captured, shell)


def _clean(folder: Path) -> None:
    """Remove the last run's output, then write back everything dirty (not measured)."""
    (folder / "plain.out").unlink(missing_ok=True)
    output = folder / "state" / "procledger" / "output"
    if output.is_dir():
        for run in output.iterdir():
            shutil.rmtree(run)
    os.sync()


FOLLOWED = """
import sys, time
for i in range(int(sys.argv[1])):
    print(time.time(), flush=True)
    time.sleep(0.02)
"""


def follow_latency(url: str, lines: int) -> None:
    from procledger import LeaseOwner, open_registry
    from procledger.application.output import follow_output
    from procledger.supervisor.supervisor import Supervisor

    registry = open_registry(url)
    delays: list[float] = []
    with Supervisor(registry, owner=LeaseOwner.local_process("bench")) as supervisor:
        handle = supervisor.start(
            [sys.executable, "-c", FOLLOWED, str(lines)], stdout=lambda chunk: None
        )
        pending = b""
        for chunk in follow_output(registry, handle.process_id):
            now = time.time()
            pending += chunk.data
            *done, pending = pending.split(b"\n")
            delays += [now - float(line) for line in done if line]
        supervisor.wait(handle)
    registry.close()
    delays.sort()
    p95 = delays[int(len(delays) * 0.95)] * 1000
    print(
        f"follow latency over {len(delays)} lines: median "
        f"{statistics.median(delays) * 1000:.1f} ms, p95 {p95:.1f} ms (target < 200 ms)"
    )


def true_runs(url: str, runs: int, env: dict[str, str]) -> None:
    on: list[float] = []
    off: list[float] = []
    for _ in range(runs):  # alternating, so a busy machine slows both alike
        on.append(timed([*CLI, "--url", url, "run", "--", "true"], env)[0])
        off.append(timed([*CLI, "--url", url, "run", "--no-capture", "--", "true"], env)[0])
    a, b = statistics.median(on), statistics.median(off)
    print(
        f"run -- true: capture {a * 1000:.0f} ms, --no-capture {b * 1000:.0f} ms "
        f"({a / b:.2f}x, target <= 1.1x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        env = {**os.environ, "XDG_STATE_HOME": str(folder / "state")}
        os.environ["XDG_STATE_HOME"] = env["XDG_STATE_HOME"]
        url = f"sqlite:///{folder}/ledger.db"
        bulk(args.gib, args.rounds, url, folder, env)
        library_bulk(args.gib, args.rounds, url, folder, env)
        follow_latency(url, 100)
        true_runs(url, args.runs, env)
    threading.enumerate()


if __name__ == "__main__":
    main()
