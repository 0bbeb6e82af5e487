"""A stand-in for the agent, started by the anchor under test.

``fake_agent.py MARKER [--spawn SHELL_COMMAND]... [--crash-first K] [--ignore-term]``

Each start appends ``start <pid> <monotonic time>`` to MARKER (CLOCK_MONOTONIC is one clock for
the whole host, so the test can compare it with its own). On its first start only it spawns
each ``--spawn`` command with ``sh -c`` (its supervised children; no pipe between them), then
appends ``spawned``. The first K starts exit 3 at once. Otherwise it waits for a signal: at
SIGTERM it appends ``term <pid>`` and exits 0, unless ``--ignore-term``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time


def append(marker: str, line: str) -> None:
    with open(marker, "a") as file:
        file.write(line + "\n")


def starts(marker: str) -> int:
    with open(marker) as file:
        return sum(line.startswith("start ") for line in file)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("marker")
    parser.add_argument("--spawn", action="append", default=[])
    parser.add_argument("--crash-first", type=int, default=0)
    parser.add_argument("--ignore-term", action="store_true")
    args = parser.parse_args()
    append(args.marker, f"start {os.getpid()} {time.monotonic()!r}")
    count = starts(args.marker)
    if count <= args.crash_first:
        return 3
    if count == 1 and args.spawn:
        for command in args.spawn:
            subprocess.Popen(["sh", "-c", command], stdin=subprocess.DEVNULL)
        append(args.marker, "spawned")
    wanted = {signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
    while True:
        signal.sigwait(wanted)
        if not args.ignore_term:
            append(args.marker, f"term {os.getpid()}")
            return 0


if __name__ == "__main__":
    sys.exit(main())
