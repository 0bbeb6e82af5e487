"""How long the ``procledger`` command takes to start, beside ``python3 -c pass`` in the same run.

Issue 14's targets, as ratios to the bare interpreter (so a busy machine slows both alike; the
runs alternate): ``procledger --version`` ≤ 4×, ``procledger ps`` on a 1,000-process ledger
≤ 8×, ``procledger run -- true`` ≤ 8×; and ``ps`` of 3,000 records in the process (no start-up)
under 300 ms. Medians of ``--runs`` runs each (at least 10).

    PYTHONPATH=src python benchmarks/startup.py [--runs N]

The command runs as the installed ``procledger`` script when it is on ``PATH`` next to this
interpreter (what a person types), else as ``python -m procledger``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from _common import sqlite_ledger

BARE = [sys.executable, "-c", "pass"]
TARGETS = {"--version": 4.0, "ps (1,000 processes)": 8.0, "run -- true": 8.0}


def procledger_command() -> list[str]:
    """The installed script beside this interpreter, else ``python -m procledger``."""
    script = Path(sys.executable).with_name("procledger")
    if script.is_file():
        return [str(script)]
    found = shutil.which("procledger")
    return [found] if found else [sys.executable, "-m", "procledger"]


def child_env() -> dict[str, str]:
    """Our environment with ``src`` on ``PYTHONPATH`` and no ``$PROCLEDGER_URL``."""
    src = str(Path(__file__).resolve().parents[1] / "src")
    path = os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    env.pop("PROCLEDGER_URL", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: bytecode cached after the warm-up
    return env


def populate(url: str, count: int) -> None:
    """``count`` finished command processes (registered, started, exited), as ``run`` leaves."""
    from procledger import (
        CompletionAuthority,
        LeaseOwner,
        Originator,
        ProcessInput,
        ProcessRegistration,
        RecoveryDisposition,
        open_registry,
    )
    from procledger.domain.registration import env_ref_for

    authority = CompletionAuthority.workflow_key("bench")
    owner = LeaseOwner(owner_id="bench", incarnation_id="1")
    registry = open_registry(url)
    try:
        for index in range(count):
            record = registry.register(
                ProcessRegistration(
                    id=f"bench-{index:06d}",
                    input=ProcessInput.command(["make", f"step-{index}"], cwd="/srv/build"),
                    disposition=RecoveryDisposition.owner_bound,
                    originator=Originator.host(),
                    env_ref=env_ref_for({"PATH": "/usr/bin"}),
                )
            )
            now = registry.now_ms()
            registry.record_first_started(record.id, owner, now)
            registry.record_started(record.id, started_at_ms=now)
            registry.record_completed(
                record.id, "exited", "exited", exit_code=0, authority=authority
            )
    finally:
        registry.close()


def timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def compare(name: str, argv: list[str], env: dict[str, str], runs: int) -> tuple[str, float, float]:
    """Medians (ms) of ``argv`` and of the bare interpreter, run alternately."""
    timed(argv, env)  # warm the file cache (and the bytecode) before counting
    pairs = [(timed(argv, env), timed(BARE, env)) for _ in range(runs)]
    ours = statistics.median(p[0] for p in pairs) * 1e3
    bare = statistics.median(p[1] for p in pairs) * 1e3
    return name, ours, bare


def in_process_ps(url: str) -> float:
    """Milliseconds `ps --all` takes inside one interpreter (the listing, not the start-up),
    median of 5, its output thrown away."""
    from procledger.cli import main

    def once() -> None:
        with open(os.devnull, "w") as null:
            saved, sys.stdout = sys.stdout, null
            try:
                main(["--url", url, "ps", "--all"])
            except SystemExit:
                pass
            finally:
                sys.stdout = saved

    return statistics.median(_seconds(once) for _ in range(5)) * 1e3


def _seconds(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="runs of each command (>= 10)")
    args = parser.parse_args()
    runs = max(args.runs, 10)
    command, env = procledger_command(), child_env()
    with sqlite_ledger() as url:
        populate(url, 1000)
        rows = [
            compare("--version", [*command, "--version"], env, runs),
            compare("ps (1,000 processes)", [*command, "--url", url, "ps", "--all"], env, runs),
            compare("run -- true", [*command, "--url", url, "run", "--", "true"], env, runs),
        ]
        populate_more = url.replace("ledger.db", "big.db")
        populate(populate_more, 3000)
        listing = in_process_ps(populate_more)
    print(f"command: {' '.join(command)}; medians of {runs} runs, alternating with the bare one")
    print(f"{'':24}{'procledger':>12}{'python -c pass':>16}{'ratio':>8}{'target':>8}")
    for name, ours, bare in rows:
        ratio = ours / bare
        print(f"{name:24}{ours:10.1f}ms{bare:14.1f}ms{ratio:7.1f}x{TARGETS[name]:7.0f}x")
    print(f"ps --all of 3,000 records, in process: {listing:.0f} ms (target < 300 ms)")


if __name__ == "__main__":
    main()
