"""Execution beside ``subprocess``, side by side in one run: medians of several rounds.

    PYTHONPATH=src python benchmarks/execution.py [--rounds N]

(a) overhead: ``run_captured(["true"])`` against ``subprocess.run(["true"], capture_output=True)``
    (target: ratio <= 1.3);
(b) interruption with a descendant holding stdout: time from ``cancel.set()`` to return, beside
    ``subprocess.run(..., timeout=T)`` (time past its deadline) and plain ``subprocess.run``,
    and whether the holder is still alive afterwards (target: < 200 ms for ours);
(c) 200 concurrent streaming runs: total time, peak threads and peak open descriptors, beside
    ``subprocess.Popen`` read the same way from the same number of caller threads.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from _common import interleaved, median_ms
from procledger.domain.errors import Interrupted
from procledger.supervisor.execution import run_captured, run_streaming

FD_DIR = "/proc/self/fd" if sys.platform == "linux" else "/dev/fd"
HOLD_S = 2.0
CONCURRENT = 200


def overhead(rounds: int, calls: int = 200) -> tuple[float, float]:
    """(a) Median of per-round medians. Calls alternate one by one, so the drift of a shared,
    busy machine hits both alike."""
    results = [
        interleaved(
            lambda: run_captured(["true"]),
            lambda: subprocess.run(["true"], capture_output=True, check=False),
            calls,
        )
        for _ in range(rounds)
    ]
    return statistics.median(r[0] for r in results), statistics.median(r[1] for r in results)


def _holder_argv(pidfile: Path) -> list[str]:
    hold = f"sleep {HOLD_S} & echo $! > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}; exit 0"
    return ["sh", "-c", hold]


def _await_pid(pidfile: Path) -> psutil.Process:
    while not pidfile.exists():
        time.sleep(0.001)
    return psutil.Process(int(pidfile.read_text()))


def _alive(process: psutil.Process) -> bool:
    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _finish(process: psutil.Process) -> bool:
    """Whether the holder outlived the call by 100 ms (a process that just closed its pipes may
    not be a zombie yet); then kill it by its pid."""
    deadline = time.monotonic() + 0.1
    while _alive(process) and time.monotonic() < deadline:
        time.sleep(0.005)
    alive = _alive(process)
    if alive:
        process.kill()
    return alive


def cancel_ours(directory: Path) -> tuple[float, bool]:
    pidfile = directory / f"ours-{time.monotonic_ns()}.pid"
    cancel = threading.Event()
    returned: list[float] = []

    def call() -> None:
        try:
            run_captured(_holder_argv(pidfile), cancel=cancel)
        except Interrupted:
            returned.append(time.perf_counter())

    thread = threading.Thread(target=call)
    thread.start()
    holder = _await_pid(pidfile)
    set_at = time.perf_counter()
    cancel.set()
    thread.join()
    return returned[0] - set_at, _finish(holder)


def timeout_subprocess(directory: Path, timeout: float | None) -> tuple[float, bool]:
    pidfile = directory / f"theirs-{time.monotonic_ns()}.pid"
    started = time.perf_counter()
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(_holder_argv(pidfile), capture_output=True, timeout=timeout, check=False)
    deadline = started + (timeout or 0.0)
    return time.perf_counter() - deadline, _finish(_await_pid(pidfile))


def interruption(rounds: int) -> list[tuple[str, float, str]]:
    """(b) Rows: (how, median ms from cancel/deadline to return, holder alive afterwards)."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        cases: dict[str, Callable[[], tuple[float, bool]]] = {
            "run_captured, cancel.set()": lambda: cancel_ours(directory),
            "subprocess.run(timeout=0.2), past deadline": lambda: timeout_subprocess(
                directory, 0.2
            ),
            "subprocess.run(), no timeout": lambda: timeout_subprocess(directory, None),
        }
        rows = []
        for name, case in cases.items():
            results = [case() for _ in range(rounds if "cancel" in name else 2)]
            alive = sum(a for _, a in results)
            rows.append((name, median_ms([t for t, _ in results]), f"{alive}/{len(results)}"))
        return rows


class Peaks:
    """Samples thread and descriptor counts while a burst runs (a benchmark may poll)."""

    def __init__(self) -> None:
        self.threads = self.fds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample)

    def __enter__(self) -> Peaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.threads = max(self.threads, threading.active_count())
            self.fds = max(self.fds, len(os.listdir(FD_DIR)))


def _stream_popen(argv: list[str], consumer: Callable[[bytes], None]) -> int:
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL) as child:
        assert child.stdout is not None
        while chunk := os.read(child.stdout.fileno(), 65536):
            consumer(chunk)
        return child.wait()


def burst(run: Callable[[list[str], Callable[[bytes], None]], object]) -> tuple[float, int, int]:
    """(c) 200 runs at once, one caller thread each: total seconds, peak threads and fds."""
    argv = ["sh", "-c", "echo start; sleep 0.5; echo end"]
    callers = [
        threading.Thread(target=run, args=(argv, lambda chunk: None)) for _ in range(CONCURRENT)
    ]
    with Peaks() as peaks:
        started = time.perf_counter()
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join()
        total = time.perf_counter() - started
    return total, peaks.threads, peaks.fds


def concurrency(rounds: int) -> list[tuple[str, float, int, int]]:
    rows = []
    for name, run in (("run_streaming", run_streaming), ("subprocess.Popen", _stream_popen)):
        results = [burst(run) for _ in range(rounds)]
        total = median_ms([r[0] for r in results])
        rows.append((name, total, max(r[1] for r in results), max(r[2] for r in results)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    baseline_threads, baseline_fds = threading.active_count(), len(os.listdir(FD_DIR))

    ours, theirs = overhead(rounds)
    print(f"(a) one `true`, median of {rounds} rounds x 200 alternating calls")
    print(f"    {'run_captured':<44}{ours:8.3f} ms")
    print(f"    {'subprocess.run(capture_output=True)':<44}{theirs:8.3f} ms")
    print(f"    {'ratio (target <= 1.30)':<44}{ours / theirs:8.2f}x")

    print(f"\n(b) descendant holds stdout for {HOLD_S} s; from cancel/deadline to return")
    print(f"    {'how':<44}{'median':>10}  holder alive after")
    for name, ms, alive in interruption(rounds):
        print(f"    {name:<44}{ms:8.1f} ms  {alive}")

    print(f"\n(c) {CONCURRENT} concurrent streaming runs of a 0.5 s command, {rounds} rounds")
    print(f"    (before: {baseline_threads} threads, {baseline_fds} fds)")
    print(f"    {'how':<44}{'total':>10}{'threads':>9}{'fds':>7}")
    for name, total, threads, fds in concurrency(rounds):
        print(f"    {name:<44}{total:8.0f} ms{threads:>9}{fds:>7}")


if __name__ == "__main__":
    main()
