"""Typing to a supervised child from the terminal ``procledger run`` was started in.

The child runs in a process group of its own (so that a stop reaches its whole tree and the
terminal's Ctrl-C reaches procledger first). A process outside the terminal's foreground group
that reads the terminal is stopped by the kernel (SIGTTIN), so the terminal itself cannot be
handed to the child. Instead procledger reads what is typed — the terminal stays in its
ordinary line mode, with echo and line editing — and passes it to the child through a pipe;
end of input (Ctrl-D) closes the pipe. Programs that need a real terminal (an editor, a pager)
are out of reach this way: on a terminal, ``run`` gives the command a pseudo-terminal of its own
instead (``cli.terminal_relay``), and this pipe is what ``--no-pty`` keeps.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections.abc import Iterator

_POLL_S = 0.2
_CHUNK = 65_536


class TerminalFeed:
    """Copies this process's terminal input into a pipe the child reads, on a daemon thread."""

    def __init__(self, source: int = 0) -> None:
        self._source = source
        self.child_end, self._write_end = os.pipe()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._copy, name="procledger-stdin", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop copying (the child has ended) and close the pipe."""
        self._done.set()
        self._thread.join(timeout=2 * _POLL_S + 1)

    def _copy(self) -> None:
        try:
            while not self._done.is_set():
                ready, _, _ = select.select([self._source], [], [], _POLL_S)
                if ready and not self._forward():
                    return
        finally:
            with contextlib.suppress(OSError):
                os.close(self._write_end)

    def _forward(self) -> bool:
        """Pass on what was typed; ``False`` at end of input or when the child stopped
        reading."""
        try:
            data = os.read(self._source, _CHUNK)
            if not data:
                return False
            os.write(self._write_end, data)
        except OSError:  # EIO when the terminal hangs up; EPIPE when the child closed stdin
            return False
        return True


@contextlib.contextmanager
def terminal_stdin() -> Iterator[int | None]:
    """The descriptor a child should read for ``--stdin inherit``: a pipe fed from the terminal
    when stdin is one, else ``None`` (the child inherits stdin as it is: a pipe or a file)."""
    if not os.isatty(0):
        yield None
        return
    feed = TerminalFeed()
    feed.start()
    try:
        yield feed.child_end
    finally:
        feed.stop()
        with contextlib.suppress(OSError):
            os.close(feed.child_end)
