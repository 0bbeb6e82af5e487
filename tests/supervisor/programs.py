"""Child programs for the execution tests: ``python programs.py MODE ARGS...``.

Portable stand-ins for shell one-liners that Linux and macOS spell differently (macOS has no
``setsid`` command). Every program is finite. Pid files are written atomically (temporary
name, then rename), so a test that sees the file can read a whole pid.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

LIFETIME_S = 30.0
"""How long a program that waits to be stopped lives if nobody stops it."""


def write_pid(path: str, pid: int) -> None:
    tmp = Path(f"{path}.tmp")
    tmp.write_text(f"{pid}\n")
    tmp.rename(path)


def await_file(path: str, timeout: float = 10.0) -> None:
    """Wait (briefly polling) for another process to create ``path``."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"{path} never appeared")
        time.sleep(0.005)


def emit(out_hex: str, err_hex: str, status: str) -> None:
    """Write exact bytes to stdout and stderr, then exit with ``status``."""
    os.write(1, bytes.fromhex(out_hex))
    os.write(2, bytes.fromhex(err_hex))
    raise SystemExit(int(status))


def stdin_report() -> None:
    """Say what stdin is (``devnull`` or ``pipe``), then how many bytes it held and their hash."""
    mine, null = os.fstat(0), os.stat(os.devnull)
    kind = "devnull" if (mine.st_dev, mine.st_ino) == (null.st_dev, null.st_ino) else "pipe"
    data = sys.stdin.buffer.read()  # returns only at EOF: proves the pipe was closed
    print(kind, len(data), hashlib.sha256(data).hexdigest())


def echo_both(size: str) -> None:
    """Fill stderr with ``size`` bytes *before* reading stdin, then copy stdin to stdout.

    Whoever feeds stdin without draining stderr deadlocks with this program.
    """
    os.write(2, bytes(range(256)) * (int(size) // 256))
    while chunk := os.read(0, 65536):
        os.write(1, chunk)


def detach(pidfile: str) -> None:
    """Start a ``sleep`` in its own session holding none of our I/O, record it, and exit 0."""
    sleeper = subprocess.Popen(
        ["sleep", str(LIFETIME_S)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    write_pid(pidfile, sleeper.pid)


def trap_stop(log: str, ready: str, escaped: str) -> None:
    """Record INT and TERM in ``log``; on INT also start an escaped process (own session,
    ignoring INT and TERM) and wait until it is ready. Only SIGKILL ends either of them."""

    def on_int(signum: int, frame: FrameType | None) -> None:
        script = f"trap '' INT TERM; echo $$ > {escaped}.tmp && mv {escaped}.tmp {escaped}; "
        subprocess.Popen(
            ["sh", "-c", f"{script}exec sleep 120"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        await_file(escaped)
        with open(log, "a") as f:
            f.write("INT\n")

    def on_term(signum: int, frame: FrameType | None) -> None:
        with open(log, "a") as f:
            f.write("TERM\n")

    signal.signal(signal.SIGINT, on_int)
    signal.signal(signal.SIGTERM, on_term)
    write_pid(ready, os.getpid())
    time.sleep(LIFETIME_S)  # handlers run during the sleep, which then resumes (PEP 475)


def ignore_int(ready: str) -> None:
    """Ignore SIGINT, say so, and live (finitely) until stopped otherwise."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    write_pid(ready, os.getpid())
    time.sleep(LIFETIME_S)


MODES: dict[str, Callable[..., None]] = {
    "emit": emit,
    "stdin-report": stdin_report,
    "echo-both": echo_both,
    "detach": detach,
    "trap-stop": trap_stop,
    "ignore-int": ignore_int,
}

if __name__ == "__main__":
    MODES[sys.argv[1]](*sys.argv[2:])
