"""The agent's control socket, round trip (docs/design.md §18.3): ``ping`` over 1,000 requests,
each from a fresh client connection as the CLI will make them, against a server in another
process; beside it the floor, a raw ``socket.socketpair`` round trip of the same bytes to an
echoing child. Prints median and p99 of each and their ratio.

Run: ``PYTHONPATH=src python benchmarks/agent_socket.py [N]``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from procledger.agent.control_client import request, socket_path

SERVER = """
import asyncio, sys
from procledger.agent.control_socket import ControlServer

async def main():
    async with ControlServer(sys.argv[1]):
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main())
"""
LINE = b'{"op":"ping"}\n'


def percentiles(samples: list[float]) -> tuple[float, float]:
    """Median and p99, in milliseconds."""
    ordered = sorted(samples)
    return statistics.median(ordered) * 1e3, ordered[int(len(ordered) * 0.99) - 1] * 1e3


def sample(n: int, once: Callable[[], object]) -> list[float]:
    for _ in range(min(50, n)):  # warm up
        once()
    samples = []
    for _ in range(n):
        began = time.perf_counter()
        once()
        samples.append(time.perf_counter() - began)
    return samples


def socketpair_baseline(n: int) -> list[float]:
    """A forked child echoes each line back: the least a local round trip can cost."""
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.close()
        while data := theirs.recv(65536):
            theirs.sendall(data)
        os._exit(0)
    theirs.close()
    try:

        def once() -> None:
            ours.sendall(LINE)
            ours.recv(65536)

        return sample(n, once)
    finally:
        ours.close()
        os.waitpid(pid, 0)


def agent_ping(n: int) -> list[float]:
    """``request(path, {"op": "ping"})`` to a ``ControlServer`` in another process."""
    runtime = tempfile.mkdtemp(prefix="pl-bench-", dir="/tmp")
    path = socket_path("sqlite:///bench", {"XDG_RUNTIME_DIR": runtime})
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, os.path.dirname(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        assert server.stdout.readline() == b"ready\n"
        return sample(n, lambda: request(path, {"op": "ping"}))
    finally:
        assert server.stdin is not None
        server.stdin.close()  # the server's cue to shut down cleanly
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(server.pid, signal.SIGKILL)
            server.wait()
        shutil.rmtree(runtime, ignore_errors=True)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    base_med, base_p99 = percentiles(socketpair_baseline(n))
    ping_med, ping_p99 = percentiles(agent_ping(n))
    print(f"requests: {n} (ping: a fresh connection each)")
    print(f"socketpair round trip   median {base_med:7.3f} ms   p99 {base_p99:7.3f} ms")
    print(f"agent ping              median {ping_med:7.3f} ms   p99 {ping_p99:7.3f} ms")
    ratio_med, ratio_p99 = ping_med / base_med, ping_p99 / base_p99
    print(f"ratio                   median {ratio_med:7.1f}x    p99 {ratio_p99:7.1f}x")


if __name__ == "__main__":
    main()
