"""A foreground run's pseudo-terminal, relayed to the terminal ``procledger run`` was started in
(docs/design.md §20.1), as ``script`` and tmux relay theirs.

Our terminal is put in raw mode, so that every key -- Ctrl-C, Ctrl-Z, Ctrl-D, an arrow -- is a
byte for the child's terminal, whose own line discipline then does what ours would have done
without procledger: it echoes, edits lines, and signals the child's foreground group. What is
typed is copied to the child's terminal by a thread of its own; it is never a ``send``: a
keystroke is not a command, and is not journalled. What the child writes reaches our stdout
through the ``stdout`` consumer given to ``Supervisor.start`` (on the pump's thread). Our window
size is passed on at the start and on every SIGWINCH.

Ctrl-Z stops the child's group, not us: the relay sees the child stopped, gives our terminal
back to the shell as it was, and stops itself with SIGTSTP, so that the shell shows the job
stopped. The shell's ``fg`` continues us: raw mode again, the window size again (it may have
changed meanwhile), and SIGCONT to the child's group. (While we are stopped, so is the
supervisor: its lease is not renewed, and a stop longer than its time to live ends the run, as
§20.1 says.)

Why the relay itself stops the child's group on Ctrl-Z: the child leads a session of its own,
its parent (us) in another, so the kernel counts its group *orphaned* -- nobody in its session
could continue it -- and discards the SIGTSTP its terminal sends, where the default action
would stop it. We can continue it, so we do what the kernel would have done in a shell's job:
when Ctrl-Z is typed and the terminal's foreground group is the child's own, whose SIGTSTP is
neither caught nor ignored, it gets SIGSTOP. A program that catches SIGTSTP (an editor, a
readline prompt) handles it itself, and its own stop is then discarded: Ctrl-Z does nothing to
it here, as under ``script`` or as a tmux pane's command. When ``procledger run`` is itself in
an orphaned group (no shell with job control started it) its SIGTSTP is discarded too: the
child is then continued at once.

Our terminal is given back as it was on every way out: the child's end, an exception, and
SIGTERM or SIGHUP to ``procledger run`` (``release``, called from their handler).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import struct
import termios
import threading
import tty
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from procledger.supervisor.terminal import DEFAULT_SIZE, Terminal, TerminalSize

if TYPE_CHECKING:
    from procledger import ProcessHandle, Supervisor

__all__ = ["RawMode", "TerminalRelay", "window_size"]

POLL_S: Final = 0.05
"""How often the relay looks at the child's state (stopped?) and its current terminal."""

_CHUNK: Final = 65_536

_TIOCGSID: Final = getattr(termios, "TIOCGSID", 0x5429)
"""The session of a terminal (Linux's number where Python names none): on a child's master, the
child's pid, since the child leads the session its terminal belongs to."""


def window_size(fds: tuple[int, ...] = (0, 1, 2)) -> TerminalSize:
    """The window of the first of ``fds`` that is a terminal; 24x80 when none is."""
    for fd in fds:
        try:
            cols, rows = os.get_terminal_size(fd)
        except (OSError, ValueError):
            continue
        if rows > 0 and cols > 0:
            return TerminalSize(min(rows, 0xFFFF), min(cols, 0xFFFF))
    return DEFAULT_SIZE


class RawMode:
    """Our terminal (``fd``) in raw mode and back as it was; nothing at all when ``fd`` is no
    terminal. Every call is safe to repeat, and none raises: a terminal that hung up (SIGHUP)
    takes no settings, and that is no reason to fail a run."""

    def __init__(self, fd: int = 0) -> None:
        self._fd = fd
        self._saved: list[Any] | None = None

    @property
    def is_terminal(self) -> bool:
        return os.isatty(self._fd)

    def enter(self, *, signals: bool = False) -> None:
        """Raw mode; with ``signals``, Ctrl-C and Ctrl-Z still signal us (while the run starts:
        until the child runs, they are ours to act on)."""
        with contextlib.suppress(termios.error, OSError):
            saved = termios.tcgetattr(self._fd)
            if self._saved is None:
                self._saved = saved
            tty.setraw(self._fd, termios.TCSADRAIN)
            if signals:
                self._set_signals(on=True)

    def keep_signals(self, on: bool) -> None:
        """Whether Ctrl-C and Ctrl-Z signal us (``on``) or are bytes for the child."""
        if self._saved is not None:
            self._set_signals(on=on)

    def _set_signals(self, *, on: bool) -> None:
        with contextlib.suppress(termios.error, OSError):
            attributes = termios.tcgetattr(self._fd)
            attributes[3] = attributes[3] | termios.ISIG if on else attributes[3] & ~termios.ISIG
            termios.tcsetattr(self._fd, termios.TCSADRAIN, attributes)

    def leave(self) -> None:
        """Our terminal as it was before ``enter``."""
        saved, self._saved = self._saved, None
        if saved is not None:
            with contextlib.suppress(termios.error, OSError):
                termios.tcsetattr(self._fd, termios.TCSADRAIN, saved)


class TerminalRelay:
    """Relays a child's pseudo-terminal to ours: ``size`` for ``start``'s ``pty``, ``raw``
    before it, ``attach`` once it runs, ``close`` once it has ended (or ``release`` from a
    signal handler). ``source``: where keys are typed (our stdin)."""

    def __init__(self, supervisor: Supervisor, source: int = 0) -> None:
        self._supervisor = supervisor
        self._source = source
        self._raw = RawMode(source)
        self._released = False  # a plain flag: set from signal handlers, which take no lock
        self._wake_read, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._thread: threading.Thread | None = None
        self._previous_winch: Any = None
        self.size = window_size()

    def raw(self) -> None:
        """Raw mode, Ctrl-C and Ctrl-Z still ours while the run starts."""
        self._raw.enter(signals=True)

    def attach(self, handle: ProcessHandle) -> None:
        """The child runs: its keys from now on, and the relay's thread."""
        self._raw.keep_signals(False)
        if threading.current_thread() is threading.main_thread():
            self._previous_winch = signal.signal(signal.SIGWINCH, self._on_winch)
        copier = _Copier(self._supervisor, handle, self._source, self._raw, self.released)
        self._thread = threading.Thread(
            target=copier.run, args=(self._wake_read,), name="procledger-terminal", daemon=True
        )
        self._thread.start()

    def released(self) -> bool:
        """Whether the relay has stopped: the child ended, or SIGTERM/SIGHUP came."""
        return self._released

    def _on_winch(self, signum: int, frame: Any) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_write, b"w")

    def release(self) -> None:
        """Our terminal back as it was, and no more keys relayed (safe in a handler)."""
        self._released = True
        self._raw.leave()

    def close(self) -> None:
        """The child has ended (or never started): stop relaying, give our terminal back."""
        self.release()
        if self._thread is not None:
            self._thread.join(timeout=10 * POLL_S + 5)
        if self._previous_winch is not None:
            signal.signal(signal.SIGWINCH, self._previous_winch)
            self._previous_winch = None
        self._raw.leave()  # again: a suspend may have entered it after ``release``
        for fd in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._wake_read = self._wake_write = -1


class _Copier:
    """The relay's thread: keys to the child's terminal, window sizes, and Ctrl-Z."""

    def __init__(
        self,
        supervisor: Supervisor,
        handle: ProcessHandle,
        source: int,
        raw: RawMode,
        done: Callable[[], bool],
    ) -> None:
        self._terminal_of: Callable[[], Terminal | None] = lambda: supervisor.terminal(handle)
        self._source: int | None = source
        self._typed_on_terminal = raw.is_terminal
        self._raw = raw
        self._done = done
        self._followed: Terminal | None = None  # the supervisor's, to tell a new attempt's
        self._master: Terminal | None = None  # our own descriptor of it: never reused under us

    def run(self, wake: int) -> None:
        try:
            while not self._done():
                self._follow()
                watched = [wake] if self._source is None else [wake, self._source]
                readable = select.select(watched, [], [], POLL_S)[0]
                if wake in readable:
                    _drain(wake)
                    self._resize()
                if self._source is not None and self._source in readable:
                    self._forward()
                if self._child_stopped():
                    self._suspend()
        finally:
            if self._master is not None:
                self._master.close()

    def _follow(self) -> None:
        """The child's current terminal (a restarted service's next attempt has a new one):
        a descriptor of our own, at our window size."""
        current = self._terminal_of()
        if current is None or current is self._followed:
            return
        self._followed = current
        if self._master is not None:
            self._master.close()
            self._master = None
        with contextlib.suppress(OSError):
            fd = os.dup(current.fileno())
            if not os.isatty(fd):  # closed and its number reused in between: not the child's
                os.close(fd)
                return
            self._master = Terminal(fd)
            self._resize()

    def _resize(self) -> None:
        if self._master is not None:
            with contextlib.suppress(OSError):
                self._master.resize(window_size())

    def _forward(self) -> None:
        """What was typed, to the child's terminal. At the end of a source that is no terminal
        (``--pty`` with a pipe), the child's end of input (Ctrl-D), as ``script`` does."""
        assert self._source is not None
        try:
            data = os.read(self._source, _CHUNK)
        except OSError:  # EIO: our terminal hung up
            data = b""
        if not data:
            self._source = None
            if not self._typed_on_terminal and self._master is not None:
                data = self._master.end_of_input()
        if data:
            self._write(memoryview(data))
            self._stop_on_suspend_key(data)

    def _write(self, view: memoryview) -> None:
        """All of it, unless the child ends first; a child that does not read holds us here,
        as it would hold a person typing."""
        master = self._master
        try:
            while view and master is not None and not self._done():
                written = master.write(view)
                view = view[written:]
                if view and not written:
                    select.select([], [master], [], POLL_S)
        except OSError:  # EIO: the child's side has closed
            return

    def _child_pid(self) -> int | None:
        if self._master is None:
            return None
        try:
            found = fcntl.ioctl(self._master.fileno(), _TIOCGSID, bytes(4))
        except OSError:
            return None
        pid: int = struct.unpack("i", found)[0]
        return pid if pid > 0 else None

    def _stop_on_suspend_key(self, typed: bytes) -> None:
        """Ctrl-Z (the terminal's VSUSP) typed to the child's own group: stop it where the
        kernel discards the terminal's SIGTSTP (see the module's docstring)."""
        pid = self._child_pid()
        if pid is None or self._master is None:
            return
        try:
            attributes = termios.tcgetattr(self._master.fileno())
            group = os.tcgetpgrp(self._master.fileno())
        except (termios.error, OSError):
            return
        suspend = attributes[6][termios.VSUSP]
        typed_it = isinstance(suspend, bytes) and suspend != b"\0" and suspend in typed
        if typed_it and attributes[3] & termios.ISIG and group == pid and _stops_on_tstp(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGSTOP)

    def _child_stopped(self) -> bool:
        pid = self._child_pid()
        return pid is not None and _state(pid) == "T"

    def _suspend(self) -> None:
        """Ctrl-Z stopped the child: our terminal back to the shell, and we stop too; once
        continued (``fg``), raw mode and the window size again, and the child continued."""
        pid = self._child_pid()
        self._raw.leave()
        # To this thread, which then stops before the call returns: sent to the process, the
        # signal may be taken by another thread while this one runs on -- and continues the
        # child before we have stopped.
        signal.pthread_kill(threading.get_ident(), signal.SIGTSTP)  # returns once continued
        if self._done():
            return
        self._raw.enter()
        self._resize()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGCONT)


def _state(pid: int) -> str | None:
    """A process's state letter (``T``: stopped by a signal), from ``/proc/<pid>/stat``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            line = stat.read()
    except OSError:
        return None
    fields = line[line.rfind(b")") + 2 :].split(b" ", 1)
    return fields[0].decode() if fields and fields[0] else None


def _stops_on_tstp(pid: int) -> bool:
    """Whether SIGTSTP's default action -- stop -- is what it does to ``pid`` (neither
    caught nor ignored), from ``/proc/<pid>/status``."""
    bit = 1 << (signal.SIGTSTP - 1)
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            masks = dict(line.split(b":", 1) for line in status if b":" in line)
        handled = int(masks[b"SigIgn"], 16) | int(masks[b"SigCgt"], 16)
    except (OSError, KeyError, ValueError):
        return False
    return not handled & bit


def _drain(fd: int) -> None:
    with contextlib.suppress(OSError):
        while os.read(fd, 4096):
            pass
