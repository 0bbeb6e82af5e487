"""The pump: a child's pipes and exit descriptor in one selector, driven by its owner's thread
(docs/design.md §6.1). Reads go to their sinks as they come; stdin is written as fast as the
pipe accepts it, concurrently with draining output, so neither a prompt the child never reads
nor a full output pipe can block the owner.
"""

from __future__ import annotations

import functools
import mmap
import selectors
import subprocess
from collections.abc import Callable
from typing import IO, Final

from procledger.domain.errors import StdinError
from procledger.supervisor import os_seam

__all__ = ["Borrower", "Consumer", "Pump", "ReaderGone"]

Consumer = Callable[[bytes], None]
"""Receives raw output chunks as they arrive, on the owner's thread."""


class Borrower:
    """A consumer that only borrows each chunk: it is handed a ``memoryview`` of a buffer the
    pump reuses for the next read, valid until it returns. Output capture is one (it writes
    the chunk to a file and lets go), so a fast child costs no allocation per chunk; any other
    consumer gets ``bytes`` of its own, as before."""

    def __call__(self, chunk: bytes | memoryview) -> None:
        raise NotImplementedError


class ReaderGone(Exception):
    """Raised by a sink whose live reader went away (``| head`` closed the pipe): the pump
    closes that output pipe, so the child's next write to it fails -- SIGPIPE -- as it would
    have had the child inherited the reader's descriptor itself."""


_FIRST_BUFFER: Final = 64 * 1024
"""The pump's first read buffer: enough for a chatty child; a fast one grows it to
a pipeful (``os_seam.READ_CHUNK``), mapped so that only the pages reads have filled take
memory."""


class Pump:
    """The child's pipes and exit descriptor in one selector, driven by the owner's thread.

    Each registration carries its handler, so one ``step`` is: select, then run the handlers of
    what is ready. Reads go to their sinks; the stdin write takes what the pipe accepts now.
    """

    def __init__(
        self,
        child: subprocess.Popen[bytes],
        exit_signal: os_seam.ExitSignal,
        data: bytes | None,
        sinks: tuple[Consumer | None, Consumer | None],
        command: str,
    ) -> None:
        self.exited = False
        self._muted = False
        self._command = command
        self._exit_signal = exit_signal
        self._selector = os_seam.new_selector()
        self._selector.register(exit_signal, selectors.EVENT_READ, self._on_exit)
        self._outputs: dict[IO[bytes], Consumer] = {}
        for pipe, sink in zip((child.stdout, child.stderr), sinks, strict=True):
            if pipe is not None and sink is not None:
                reader = functools.partial(self._read, pipe)
                self._selector.register(pipe, selectors.EVENT_READ, reader)
                self._outputs[pipe] = sink
        self._stdin = child.stdin
        self._buffer: bytearray | mmap.mmap | None = None  # made at the first borrowed read
        self._pending = memoryview(data or b"")
        if self._stdin is not None and data:
            self._selector.register(self._stdin, selectors.EVENT_WRITE, self._write)
        elif self._stdin is not None:  # empty input: the child sees EOF at once
            self._stdin.close()
            self._stdin = None

    @property
    def busy(self) -> bool:
        """Whether owned I/O remains: output not at EOF, or input not yet written whole."""
        return bool(self._outputs) or self._stdin is not None

    def step(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` seconds for something to happen, and handle it."""
        for key, _ in self._selector.select(timeout):
            key.data()

    def watched(self) -> list[tuple[int, bool]]:
        """The descriptors ``step`` waits for now, each with whether it waits to write."""
        return [
            (key.fd, bool(key.events & selectors.EVENT_WRITE))
            for key in self._selector.get_map().values()
        ]

    def mute(self) -> None:
        """Stop calling sinks: after a failure nobody will look at the output."""
        self._muted = True

    def close_input(self) -> None:
        """Abandon stdin: a tree being stopped gets no more of it."""
        if self._stdin is not None:
            self._selector.unregister(self._stdin)
            self._stdin.close()
            self._stdin = None

    def drain(self) -> None:
        """Deliver what the output pipes hold now, then close them (their writers are dead)."""
        for pipe in list(self._outputs):
            while not self._muted and pipe in self._outputs and self._read(pipe):
                pass
            if pipe in self._outputs:
                self._close_output(pipe)

    def close(self) -> None:
        """Close every owned pipe (without reading) and the selector, and let the read buffer
        go: a finished child may be kept a while (a supervisor keeps its newest finished runs
        whole), and each kept 64 KiB (or a 1 MiB mapping) for as long."""
        self.close_input()
        for pipe in list(self._outputs):
            self._close_output(pipe)
        self._selector.close()
        self._buffer = None

    def _on_exit(self) -> None:
        self.exited = True
        self._selector.unregister(self._exit_signal)  # level-triggered: would fire forever

    def _read(self, pipe: IO[bytes]) -> bool:
        """Read once; True if bytes came (there may be more)."""
        sink = self._outputs[pipe]
        borrower = sink if isinstance(sink, Borrower) else None
        try:
            chunk = self._read_into(pipe) if borrower is not None else os_seam.read_available(pipe)
        except OSError:
            self._close_output(pipe)
            raise
        if not chunk:
            if chunk is not None:  # EOF: every holder of the write end has closed it
                self._close_output(pipe)
            return False
        if not self._muted:
            try:
                if borrower is not None:
                    borrower(chunk)
                else:
                    sink(bytes(chunk))  # already bytes: no copy
            except ReaderGone:
                self._close_output(pipe)
                return False
        return True

    def _read_into(self, pipe: IO[bytes]) -> memoryview | None:
        """Read into the reused buffer: a view of what came (empty at EOF), None if nothing."""
        if self._buffer is None:
            self._buffer = bytearray(_FIRST_BUFFER)
        count = os_seam.read_into(pipe, self._buffer)
        if count is None:
            return None
        view = memoryview(self._buffer)[:count]
        if count == len(self._buffer) < os_seam.READ_CHUNK:  # a fast writer: take a pipeful
            self._buffer = mmap.mmap(-1, os_seam.READ_CHUNK)  # pages come as reads fill them
        return view

    def _write(self) -> None:
        assert self._stdin is not None  # registered only while open
        try:
            written = os_seam.write_available(self._stdin, self._pending)
        except BrokenPipeError as exc:
            unwritten = len(self._pending)
            self.close_input()
            raise StdinError(
                f"command {self._command!r} closed its stdin with {unwritten} input bytes unwritten"
            ) from exc
        self._pending = self._pending[written:]
        if not self._pending:
            self.close_input()

    def _close_output(self, pipe: IO[bytes]) -> None:
        self._selector.unregister(pipe)
        del self._outputs[pipe]
        pipe.close()
