"""Readiness probes of one supervised run (docs/design.md §15).

A ``ReadinessWatch`` is made before the spawn -- it owns the run's ``NOTIFY_SOCKET`` (an
``AF_UNIX`` datagram socket in a private folder) and wraps the capture sinks for an output
probe -- and then watched by one thread of the supervisor until every probe has held once, the
ready timeout passes or the run ends.

- ``port``: a TCP connect to the host succeeds (each attempt is a connect and a close);
- ``output``: a complete line of stdout or stderr matches the regex. The sinks only append to
  a line buffer and search the new complete lines, and stop looking after the first match, so
  capture is not slowed for the rest of the run; a line longer than 64 KiB is searched in
  pieces;
- ``file``: the path (relative: to the child's directory) exists;
- ``notify``: a datagram with the line ``READY=1`` arrives (sd_notify's protocol: programs that
  already speak it need no change).

Probes are polled every 5 ms at first, backing off to 50 ms; an output match or a datagram
wakes the watcher at once.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final

from procledger.domain.errors import ExecutionError, InvalidTransition
from procledger.domain.service import Readiness
from procledger.supervisor.execution import Consumer

__all__ = ["NOTIFY_SOCKET", "NotReadyInTime", "ReadinessWatch", "StopOnTimeout", "watching"]

NOTIFY_SOCKET: Final = "NOTIFY_SOCKET"
"""The variable sd_notify reads the socket's path from."""
POLL_FIRST_S: Final = 0.005
POLL_MAX_S: Final = 0.05
_MAX_LINE: Final = 64 * 1024


class ReadinessWatch:
    """One run's probes: made before the spawn, watched by one thread after it."""

    def __init__(self, spec: Readiness, workdir: str) -> None:
        self.spec = spec
        self._workdir = workdir
        self._pattern = None if spec.output is None else re.compile(spec.output)
        self._held: dict[str, bool] = dict.fromkeys(spec.probes, False)
        self._partial: list[bytes] = [b"", b""]
        self._output_done = self._pattern is None
        self._woken = threading.Event()
        self._folder: str | None = None
        self._socket: socket.socket | None = None
        if spec.notify:
            self._open_socket()

    def _open_socket(self) -> None:
        self._folder = tempfile.mkdtemp(prefix="procledger-notify-")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(os.path.join(self._folder, "notify"))
            sock.setblocking(False)
        except OSError:
            sock.close()
            shutil.rmtree(self._folder, ignore_errors=True)
            raise
        self._socket = sock

    def child_env(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` with ``NOTIFY_SOCKET`` set when the notify probe is on."""
        if self._folder is None:
            return env
        return {**env, NOTIFY_SOCKET: os.path.join(self._folder, "notify")}

    def sink(self, stream: int, inner: Consumer) -> Consumer:
        """``inner``, also feeding the output probe until it matched once."""
        if self._pattern is None:
            return inner

        def sink(chunk: bytes) -> None:
            inner(chunk)
            if not self._output_done:
                self._feed(stream, chunk)

        return sink

    def _feed(self, stream: int, chunk: bytes) -> None:
        data = self._partial[stream] + chunk
        cut = data.rfind(b"\n")
        if cut < 0 and len(data) < _MAX_LINE:
            self._partial[stream] = data
            return
        complete, rest = (data, b"") if cut < 0 else (data[:cut], data[cut + 1 :])
        self._partial[stream] = rest[-_MAX_LINE:]
        pattern = self._pattern
        assert pattern is not None
        text = complete.decode("utf-8", "replace")
        if any(pattern.search(line) for line in text.split("\n")):
            self._output_done = True
            self._woken.set()

    def watch(
        self,
        alive: Callable[[], bool],
        on_ready: Callable[[list[str]], None],
        on_timeout: Callable[[list[str]], None],
    ) -> None:
        """Until every probe held (``on_ready``), the timeout passed (``on_timeout`` with the
        probes still missing) or ``alive()`` turns false; then close the socket."""
        deadline = None if self.spec.timeout_s is None else time.monotonic() + self.spec.timeout_s
        pause = POLL_FIRST_S
        try:
            while alive():
                if self._check():
                    on_ready(list(self._held))
                    return
                if deadline is not None and time.monotonic() >= deadline:
                    on_timeout([name for name, held in self._held.items() if not held])
                    return
                self._sleep(pause if deadline is None else min(pause, deadline - time.monotonic()))
                pause = min(pause * 2, POLL_MAX_S)
        finally:
            self.close()

    def _check(self) -> bool:
        spec, held = self.spec, self._held
        if spec.port is not None and not held[f"port:{spec.port}"]:
            held[f"port:{spec.port}"] = _connects(spec.host, spec.port)
        if spec.output is not None:
            held[f"output:{spec.output}"] = self._output_done
        if spec.file is not None and not held[f"file:{spec.file}"]:
            held[f"file:{spec.file}"] = os.path.exists(os.path.join(self._workdir, spec.file))
        if spec.notify and not held["notify"]:
            held["notify"] = self._notified()
        return all(held.values())

    def _notified(self) -> bool:
        """Drain the socket; whether a datagram said ``READY=1``."""
        ready = False
        while self._socket is not None:
            try:
                data = self._socket.recv(4096)
            except (BlockingIOError, InterruptedError):
                break
            ready = ready or b"READY=1" in data.split(b"\n")
        return ready

    def _sleep(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        if self._socket is not None:  # poll, not select: the agent's fds pass FD_SETSIZE
            readable = select.poll()
            readable.register(self._socket, select.POLLIN)
            readable.poll(seconds * 1000)
        else:
            self._woken.wait(seconds)
            self._woken.clear()

    def close(self) -> None:
        """Close the notify socket and remove its folder (idempotent)."""
        sock, self._socket = self._socket, None
        if sock is not None:
            sock.close()
        folder, self._folder = self._folder, None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _connects(host: str, port: int) -> bool:
    """Whether a TCP connect to ``host:port`` succeeds now (closed at once)."""
    try:
        connection = socket.create_connection((host, port), timeout=0.25)
    except OSError:
        return False
    connection.close()
    return True


class NotReadyInTime(ExecutionError):
    """A run's readiness probes did not all hold within its ready timeout; its tree was
    stopped. Recorded ``failed``/``ready_timeout`` with this message (docs/design.md §15.2)."""


class StopOnTimeout:
    """A ``cancel`` for ``run_streaming`` set by the caller's own ``cancel`` or by a ready
    timeout (``why`` then says what did not hold)."""

    def __init__(self, cancel: threading.Event) -> None:
        self._cancel = cancel
        self.why: str | None = None

    def is_set(self) -> bool:
        return self.why is not None or self._cancel.is_set()


@contextmanager
def watching(
    watch: ReadinessWatch | None,
    record_ready: Callable[[list[str]], object],
    stop: StopOnTimeout,
) -> Iterator[None]:
    """Watch ``watch`` on a thread of its own while the ``with`` body runs the child: when
    all probes held, ``record_ready(probes)`` (a run that ended first is never ready); past the
    ready timeout, ``stop.why`` is set, which stops the run (a recovery re-run)."""
    if watch is None:
        yield
        return
    finished = threading.Event()

    def on_ready(probes: list[str]) -> None:
        try:
            record_ready(probes)
        except InvalidTransition:
            return

    def on_timeout(missing: list[str]) -> None:
        limit = watch.spec.timeout_s or 0.0
        stop.why = f"not ready within {limit:g} s: {', '.join(missing)} did not hold"

    thread = threading.Thread(
        target=watch.watch,
        args=(lambda: not finished.is_set(), on_ready, on_timeout),
        name="procledger-readiness",
        daemon=True,
    )
    thread.start()
    try:
        yield
    finally:
        finished.set()
        thread.join()
