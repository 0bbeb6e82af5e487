"""The agent's output files (issue 28, procledger.adapters.direct_output), bounded in time.

- Idle: a ``Follower`` watching N files (``--files``, default 50 and 1000) that nobody writes,
  in an event loop for ``--idle`` seconds: CPU seconds spent, as % of one core, for the inotify
  follower and for the stat-poll fallback (what macOS would get).
- Lag: one child writes a line stamped with ``CLOCK_MONOTONIC`` every 10 ms to each of 50 files
  in turn (their stdout, as the agent opens it, for file 0); the follower's loop reports it:
  p50, p95 and max from the write to the report.
- Bound: a child writing ``--mib`` MiB flat out under a 1 MiB limit, the loop enforcing the
  bound on every wake-up: the largest disk use seen just before and just after an enforcement
  (after: including what the child wrote while the punch ran -- the writer never waits for it),
  punches made, and the CPU the loop spent per MiB written.

    PYTHONPATH=src python benchmarks/agent_output.py [--idle 5] [--mib 200]
"""

from __future__ import annotations

import argparse
import os
import selectors
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from procledger.adapters.direct_output import (
    Backend,
    Follower,
    OutputFiles,
    Update,
    open_output_files,
)

STAMPER = """
import os, sys, time
fds = [os.open(p, os.O_WRONLY | os.O_APPEND) for p in sys.argv[2:]]
end = time.monotonic() + float(sys.argv[1])
n = 0
while time.monotonic() < end:
    os.write(fds[n % len(fds)], b"%d\\n" % time.monotonic_ns())
    n += 1
    time.sleep(0.01)
"""

FLOOD = """
import os, sys
block, left = b"y" * 65535 + b"\\n", int(sys.argv[1])
while left > 0:
    left -= os.write(1, block[: min(left, len(block))])
"""


def loop(follower: Follower, seconds: float, each: Callable[[list[Update]], bool]) -> None:
    """The agent's loop: sleep on the one fd (or the poll timeout), then read what is ready;
    until ``each`` says stop or ``seconds`` passed."""
    end = time.monotonic() + seconds
    with selectors.DefaultSelector() as selector:
        selector.register(follower, selectors.EVENT_READ)
        while (left := end - time.monotonic()) > 0:
            timeout = follower.timeout()
            selector.select(left if timeout is None else min(timeout, left))
            if each(follower.read_ready()):
                return


def idle(files: int, backend: Backend, seconds: float) -> float:
    with tempfile.TemporaryDirectory() as tmp, Follower(backend) as follower:
        for n in range(files):
            path = Path(tmp) / f"f{n}"
            path.touch()
            follower.watch(path, data=False)
        follower.read_ready()
        before = time.process_time()
        loop(follower, seconds, lambda _: False)
        return (time.process_time() - before) / seconds * 100


def lag(backend: Backend, seconds: float) -> list[float]:
    lags: list[float] = []

    def note(updates: list[Update]) -> bool:
        now = time.monotonic_ns()
        for update in updates:
            lags.extend((now - int(t)) / 1e6 for t in update.data.split())
        return False

    with tempfile.TemporaryDirectory() as tmp, Follower(backend) as follower:
        paths = [Path(tmp) / f"f{n}" for n in range(50)]
        for path in paths:
            path.touch()
            follower.watch(path)
        child = subprocess.Popen([sys.executable, "-c", STAMPER, str(seconds), *map(str, paths)])
        loop(follower, seconds + 1, note)
        child.wait()
    return lags


def bound(mib: int) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "run"
        out, err = open_output_files(folder)
        child = subprocess.Popen([sys.executable, "-c", FLOOD, str(mib << 20)], stdout=out)
        os.close(out)
        os.close(err)
        files, seen = OutputFiles(folder, 1 << 20), {"before": 0, "after": 0, "punches": 0}

        def enforce(_: list[Update]) -> bool:
            seen["before"] = max(seen["before"], os.stat(files.paths[0]).st_blocks * 512)
            seen["punches"] += files.enforce_bound() > 0
            seen["after"] = max(seen["after"], os.stat(files.paths[0]).st_blocks * 512)
            return child.poll() is not None

        with Follower() as follower:
            follower.watch(files.paths[0], data=False)
            cpu = time.process_time()
            loop(follower, 120, enforce)
            cpu = time.process_time() - cpu
        child.wait()
        enforce([])
        size = files.paths[0].stat().st_size
    return (
        f"{size >> 20} MiB written: disk use at most {seen['before'] / 2**20:.2f} MiB before an "
        f"enforcement, {seen['after'] / 2**20:.2f} MiB after; {seen['punches']} punches; "
        f"loop CPU {cpu * 1000 / mib:.2f} ms per MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=float, default=5.0)
    parser.add_argument("--mib", type=int, default=200)
    options = parser.parse_args()
    backends: tuple[Backend, ...] = ("inotify", "poll")
    for files in (50, 1000):
        for backend in backends:
            share = idle(files, backend, options.idle)
            print(f"idle, {files} files, {backend}: {share:.3f}% of one core")
    for backend in backends:
        found = sorted(lag(backend, 3.0))
        p95 = found[int(len(found) * 0.95)]
        print(
            f"lag write→report, {backend}, {len(found)} lines over 50 files: p50 "
            f"{statistics.median(found):.2f} ms, p95 {p95:.2f} ms, max {found[-1]:.2f} ms"
        )
    print("bound:", bound(options.mib))


if __name__ == "__main__":
    main()
