"""A pseudo-terminal for a child (docs/design.md §20.1): the child's controlling terminal, its
stdin, stdout and stderr; procledger holds the other side, the master, and relays it.

Why a pseudo-terminal procledger relays rather than the terminal itself handed over (a shell's
job control): the output must still be captured, and a background session has no terminal to
hand over. ``script``, tmux and Codex's unified exec relay one for the same reasons.

Why ``preexec_fn``: a child takes a controlling terminal only as a session leader, by
``TIOCSCTTY`` on it (or by opening it); ``subprocess`` offers ``start_new_session`` (the
``setsid``) but no way to make that call, and ``posix_spawn`` here cannot change directory.
The function runs one ``ioctl`` between fork and exec.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import subprocess
import termios
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DEFAULT_SIZE",
    "Appender",
    "Terminal",
    "TerminalSize",
    "open_terminal",
    "relayed",
    "spawn_on_terminal",
    "take_terminal",
]


@dataclass(frozen=True, slots=True)
class TerminalSize:
    """A terminal's window in character cells."""

    rows: int = 24
    cols: int = 80

    def __post_init__(self) -> None:
        for name, value in (("rows", self.rows), ("cols", self.cols)):
            if not (isinstance(value, int) and 0 < value <= 0xFFFF):
                raise ValueError(f"terminal {name} must be 1..65535, not {value!r}")

    def packed(self) -> bytes:
        return struct.pack("HHHH", self.rows, self.cols, 0, 0)


DEFAULT_SIZE: Final = TerminalSize()


class Terminal:
    """The master side of a child's pseudo-terminal: what it writes comes out here, and what
    is written here it reads. Non-blocking; closed once, by its owner."""

    def __init__(self, master: int) -> None:
        self._master = master
        self._with: list[int] = []  # descriptors that live as long as it (``relayed``'s file)

    def also_close(self, fd: int) -> None:
        self._with.append(fd)

    def fileno(self) -> int:
        return self._master

    @property
    def closed(self) -> bool:
        return self._master < 0

    def write(self, data: bytes | memoryview) -> int:
        """Write what the terminal takes now (0 when its input queue is full)."""
        try:
            return os.write(self._master, data)
        except BlockingIOError:
            return 0

    def read(self, size: int = 65_536) -> bytes | None:
        """What the child wrote: ``None`` when nothing is there, ``b""`` once every holder of
        the child's side has closed it (the kernel says ``EIO``)."""
        try:
            return os.read(self._master, size)
        except BlockingIOError:
            return None
        except OSError:  # EIO: the child's side hung up
            return b""

    def resize(self, size: TerminalSize) -> None:
        """Set the window; the kernel sends SIGWINCH to the terminal's foreground group."""
        fcntl.ioctl(self._master, termios.TIOCSWINSZ, size.packed())

    def hides_input(self) -> bool:
        """Whether what is typed now is a secret: echo off in line mode, as ``getpass``,
        ``sudo`` and ``read -s`` read a password. A line editor (readline, a full-screen
        program) turns echo off too, but also line mode, and echoes what it reads itself."""
        try:
            flags = termios.tcgetattr(self._master)[3]
        except termios.error:
            return False  # cannot tell: the bytes are kept, as on a pipe
        return not flags & termios.ECHO and bool(flags & termios.ICANON)

    def end_of_input(self) -> bytes:
        """What ends input on this terminal (Ctrl-D, its VEOF), as the child's read sees it."""
        try:
            eof = termios.tcgetattr(self._master)[6][termios.VEOF]
        except (termios.error, IndexError):
            return b"\x04"
        return eof if isinstance(eof, bytes) else bytes([eof])

    def close(self) -> None:
        for fd in [self._master, *self._with] if self._master >= 0 else []:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._master, self._with = -1, []


def open_terminal(size: TerminalSize = DEFAULT_SIZE) -> tuple[Terminal, int]:
    """A new pseudo-terminal of ``size``: the master (non-blocking, close-on-exec) and the
    child's side, which the caller gives the child and then closes."""
    master, child_side = os.openpty()
    try:
        os.set_blocking(master, False)
        fcntl.ioctl(child_side, termios.TIOCSWINSZ, size.packed())
    except BaseException:
        os.close(master)
        os.close(child_side)
        raise
    return Terminal(master), child_side


def take_terminal() -> None:
    """Run in the child, after ``setsid`` and before exec: make its stdin -- the terminal --
    its controlling terminal, so Ctrl-C reaches its foreground group and ``/dev/tty`` opens."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def spawn_on_terminal(
    size: TerminalSize,
    spawn: Callable[..., subprocess.Popen[bytes]],
    stdout: Callable[[bytes], None] | None,
    files: tuple[int, int] | None,
) -> tuple[subprocess.Popen[bytes], Terminal, Callable[[bytes], None]]:
    """``spawn(terminal=child_side)`` on a new terminal of ``size``: the child, the master,
    and the sink its output goes to (``relayed``). The child's side is closed here once the
    child has it; the master too if the spawn fails."""
    terminal, child_side = open_terminal(size)
    try:
        child = spawn(terminal=child_side)
    except BaseException:
        terminal.close()
        raise
    finally:
        os.close(child_side)
    return child, terminal, relayed(child, terminal, stdout, files)


def relayed(
    child: subprocess.Popen[bytes],
    terminal: Terminal,
    stdout: Callable[[bytes], None] | None,
    files: tuple[int, int] | None,
) -> Callable[[bytes], None]:
    """Where a terminal's output goes: read by the pump as the child's stdout (a descriptor
    of its own, which the pump closes at the end), to ``stdout`` when given, else appended to
    the stdout file the child would have written (the agent's capture, §14.1), else nowhere
    -- but read all the same, or the child would block on a full terminal."""
    child.stdout = os.fdopen(os.dup(terminal.fileno()), "rb", buffering=0)
    if stdout is not None:
        return stdout
    if files is None:
        return _discard
    appender = Appender(os.dup(files[0]))
    terminal.also_close(appender.fd)
    return appender


def _discard(chunk: bytes) -> None:
    """Output nobody keeps or reads."""


class Appender:
    """Appends a terminal's output to a file, as the child writing it would have; its owner
    closes ``fd`` (``Terminal.close`` for the pump's, the agent's session for a relay)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __call__(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        while view:
            view = view[os.write(self.fd, view) :]
