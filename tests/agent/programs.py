"""Children for the agent's output tests, run as ``python programs.py MODE ARGS...``.

- ``ticker PIDFILE``: a numbered line to stdout and to stderr every 10 ms, forever (stopped by
  the test, by exact pid); ``SIGPIPE`` at its default, so a dead reader kills it as it kills
  a shell loop (Python itself would ignore it and raise ``BrokenPipeError``).
- ``lines``: for each line ``I`` read from stdin, ``line(I)`` to stdout; exits at EOF.
- ``fan PATH...``: for each line ``I`` read from stdin, ``line(I)`` appended to every PATH.
- ``chunks``: for each line read from stdin, the next ``CHUNK`` bytes of ``pattern`` to stdout.
- ``flood N``: the first N bytes of ``pattern`` to stdout, as fast as it can, then exits.
- ``supervisor FOLDER PIDFILE``: a stand-in for the agent: opens FOLDER's output files, spawns
  a ``ticker`` on them in a session of its own, then follows the stdout file and prints the
  offset reached after each report, until it is killed.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

CHUNK = 64 * 1024
LINE = 64


def line(number: int) -> bytes:
    """Line ``number``: its number and a filler, ``LINE`` bytes with the newline."""
    text = f"{number:015d} "
    return (text + "x" * (LINE - len(text) - 1) + "\n").encode()


def pattern(start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of the endless run of ``line(0)``, ``line(1)``, ..."""
    first, last = start // LINE, -(-end // LINE)
    data = b"".join(line(n) for n in range(first, last))
    return data[start - first * LINE : end - first * LINE]


def ticker(pidfile: str) -> None:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # as a shell or C child meets a dead reader
    Path(pidfile).write_text(str(os.getpid()))
    number = 0
    while True:
        os.write(1, f"{number}\n".encode())
        os.write(2, f"e{number}\n".encode())
        number += 1
        time.sleep(0.01)  # the child's own pace, not a synchronisation


def lines() -> None:
    for text in sys.stdin:
        os.write(1, line(int(text)))


def fan(paths: list[str]) -> None:
    fds = [os.open(p, os.O_WRONLY | os.O_APPEND) for p in paths]
    for text in sys.stdin:
        for fd in fds:
            os.write(fd, line(int(text)))


def chunks() -> None:
    at = 0
    for _ in sys.stdin:
        data = memoryview(pattern(at, at + CHUNK))
        while data:
            data = data[os.write(1, data) :]
        at += CHUNK


def flood(total: int) -> None:
    at = 0
    while at < total:
        data = memoryview(pattern(at, min(total, at + CHUNK)))
        at += len(data)
        while data:
            data = data[os.write(1, data) :]


def supervisor(folder: str, pidfile: str) -> None:
    from procledger.adapters.direct_output import Follower, open_output_files, stream_paths

    out, err = open_output_files(Path(folder))
    argv = [sys.executable, __file__, "ticker", pidfile]
    subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
    os.close(out)
    os.close(err)
    follower = Follower()
    follower.watch(stream_paths(Path(folder))[0])
    selector = selectors.DefaultSelector()
    selector.register(follower, selectors.EVENT_READ)
    while True:
        selector.select(follower.timeout())
        for update in follower.read_ready():
            print(update.offset + len(update.data), flush=True)


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "ticker":
        ticker(args[0])
    elif mode == "lines":
        lines()
    elif mode == "fan":
        fan(args)
    elif mode == "chunks":
        chunks()
    elif mode == "flood":
        flood(int(args[0]))
    elif mode == "supervisor":
        supervisor(args[0], args[1])
