"""How long the ``procledger`` command takes to start, beside ``python3 -I -c pass`` in the same
run (issue 29; docs/design.md §8.1).

The hot commands on a SQLite ledger of 1,000 processes, each as a ratio to the bare interpreter
(so a busy machine slows both alike; the runs alternate), target ≤ 4× each: ``ps``,
``show ID``, ``logs ID --tail 20``, ``wait ID`` (ended), ``stop ID`` (ended), and ``run
--background -- true``; without an agent and with one running (``agent start``; ``run
--background`` always has one). ``ps --all`` of 3,000 rows as a whole command: target
≤ 150 ms. ``--version`` for reference. Medians of ``--runs`` runs each (at least 11).

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
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from _common import sqlite_ledger

BARE = [sys.executable, "-I", "-c", "pass"]
TARGET_RATIO = 4.0
TARGET_LIST_MS = 150.0


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


def _seconds(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def hot_rows(command: list[str], url: str, env: dict[str, str], runs: int) -> list[Row]:
    """The hot commands on ``url``: a finished process with output to show, log and wait on."""
    done = subprocess.run(
        [*command, "--url", url, "run", "--json", "--", "seq", "1", "100"],
        env=env, capture_output=True, check=True,
    )  # fmt: skip
    process_id = orjson.loads(done.stdout)["id"]
    cases = {
        "ps": ["ps"],
        "show ID": ["show", process_id],
        "logs ID --tail 20": ["logs", process_id, "--tail", "20"],
        "wait ID (ended)": ["wait", process_id, "--until", "exit"],
        "stop ID (ended)": ["stop", process_id],
    }
    return [
        compare(name, [*command, "--url", url, *words], env, runs) for name, words in cases.items()
    ]


Row = tuple[str, float, float]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="runs of each command (>= 11)")
    args = parser.parse_args()
    runs = max(args.runs, 11)
    command, env = procledger_command(), child_env()
    with tempfile.TemporaryDirectory() as home:
        env |= {"XDG_STATE_HOME": f"{home}/state", "XDG_RUNTIME_DIR": f"{home}/run"}
        os.makedirs(f"{home}/run", mode=0o700)
        with sqlite_ledger() as url:
            populate(url, 1000)
            plain = hot_rows(command, url, env, runs)
            plain.append(compare("--version", [*command, "--version"], env, runs))
            agent = [*command, "--url", url, "agent"]
            subprocess.run([*agent, "start"], env=env, capture_output=True, check=True)
            try:
                warm = hot_rows(command, url, env, runs)
                background = [*command, "--url", url, "run", "--background", "--", "true"]
                warm.append(compare("run --background -- true", background, env, runs))
            finally:
                subprocess.run(
                    [*agent, "stop", "--stop-children"], env=env, capture_output=True, check=False
                )
            big = url.replace("ledger.db", "big.db")
            populate(big, 3000)
            listing = compare(
                "ps --all (3,000 rows)", [*command, "--url", big, "ps", "--all"], env, runs
            )
    print(f"command: {' '.join(command)}; medians of {runs} runs, alternating with the bare one")
    for title, rows in (("without an agent", plain), ("with the agent running", warm)):
        target = f"  target {TARGET_RATIO:.0f}x"
        print(f"{title:28}{'procledger':>12}{'python -I -c pass':>19}{'ratio':>8}{target}")
        for name, ours, bare in rows:
            print(f"  {name:26}{ours:10.1f}ms{bare:17.1f}ms{ours / bare:7.1f}x")
    name, ours, bare = listing
    print(f"{name}: {ours:.0f} ms (bare {bare:.0f} ms; target <= {TARGET_LIST_MS:.0f} ms)")


if __name__ == "__main__":
    main()
