"""Knowing when a background process waits for input (docs/design.md §20.3), from /proc alone.

A process waits for input when one of its threads sleeps (state ``S``) in a call that reads the
session's input: ``read`` and its kin on a descriptor that *is* that input, or ``select``/
``poll`` watching such a descriptor for reading. Output, sleeping, computing and writing never
look like that -- ``sleep`` is in ``clock_nanosleep``, a busy loop is ``running``, ``yes >
/dev/null`` is running or in ``write`` -- so the test has no false positives by construction,
not by timing. What the wait *is* (a password, a yes/no question, a prompt) is told from the
terminal's modes and the last line of output (``classify``). ``InputWaitWatch`` turns the
samples into one ``Waiting`` per episode.

No I/O but /proc, the terminal's ioctls and ``os.stat``; a process that vanishes, or that this
user may not look into, is simply not waiting: nothing here raises for it.
"""

from __future__ import annotations

import codecs
import fcntl
import os
import re
import stat
import struct
import sys
import termios
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from procledger.adapters.syscalls import (
    BlockedCall,
    CallShape,
    InputCall,
    input_calls,
    parse_syscall,
)
from procledger.domain.errors import ExecutionError
from procledger.domain.input import WaitKind

__all__ = [
    "InputSource",
    "InputWaitWatch",
    "Waiting",
    "blocked_reader",
    "classify",
]

_TIOCGPTN = 0x80045430
"""``_IOR('T', 0x30, unsigned int)``: the pty's number, as on x86_64 and aarch64 (Python's
``termios`` does not name it)."""
_DEV_TTY = (5, 0)
"""``/dev/tty``: whatever terminal the opener controls (``getpass``, ``sudo`` and ``ssh`` read
their password there, not from stdin)."""
_POLL_READ = 0x0001 | 0x0002 | 0x0040  # POLLIN | POLLPRI | POLLRDNORM
_MOST_FDS = 4096
"""The most descriptors of one ``select``/``poll`` call read from memory: more is not a prompt."""
_MOST_PROCESSES = 4096
"""The most processes of one session looked at per check: a fork bomb is not waiting."""
_LAST_LINE_CHARS = 200
_KEPT_RAW_CHARS = 4096


@dataclass(frozen=True, slots=True)
class Waiting:
    """One episode of waiting: who reads (``pid``), what it seems to want, the last line of
    output it left (ANSI escapes and carriage returns removed, at most 200 characters) and
    ``how`` it blocks (``read(fd 0)``, ``pselect6(fd 0)``...)."""

    pid: int
    kind: WaitKind
    last_line: str
    how: str


@dataclass(frozen=True, slots=True)
class InputSource:
    """What a session's input is, as /proc shows it in another process's descriptors: the
    pseudo-terminal's slave device (``terminal``: major, minor) or the pipe's inode
    (``pipe``: st_dev, st_ino). ``master_fd`` is kept for the terminal's modes and foreground
    process group, which only the master side can tell."""

    terminal: tuple[int, int] | None = None
    master_fd: int | None = None
    pipe: tuple[int, int] | None = None

    @classmethod
    def of_terminal(cls, master_fd: int) -> InputSource:
        """The pseudo-terminal whose master is ``master_fd``. On a system without /proc the
        source matches nothing (nothing is ever found waiting) but its modes still classify.

        Raises ``ExecutionError`` when ``master_fd`` is not a pseudo-terminal's master."""
        if sys.platform != "linux":
            return cls(master_fd=master_fd)
        try:
            (number,) = struct.unpack("I", fcntl.ioctl(master_fd, _TIOCGPTN, bytes(4)))
            slave = os.stat(f"/dev/pts/{number}")
        except OSError as exc:
            raise ExecutionError(
                f"fd {master_fd} is not the master of a pseudo-terminal: {exc.strerror}"
            ) from exc
        return cls(terminal=(os.major(slave.st_rdev), os.minor(slave.st_rdev)), master_fd=master_fd)

    @classmethod
    def of_pipe(cls, write_fd: int) -> InputSource:
        """The pipe one of whose ends is ``write_fd`` (either end names the same inode).

        Raises ``ExecutionError`` when ``write_fd`` is not a pipe."""
        try:
            found = os.fstat(write_fd)
        except OSError as exc:
            raise ExecutionError(f"fd {write_fd} cannot be read: {exc.strerror}") from exc
        if not stat.S_ISFIFO(found.st_mode):
            raise ExecutionError(f"fd {write_fd} is not a pipe")
        return cls(pipe=(found.st_dev, found.st_ino))


# ---------------------------------------------------------------------------------------------
# Who is blocked reading the source


def blocked_reader(source: InputSource, root_pid: int) -> tuple[int, str] | None:
    """The process blocked reading ``source`` now, and how (``read(fd 0)``), or ``None``.

    Looked at: ``root_pid`` and its descendants -- for a terminal only those of its foreground
    process group (and that group's leader, should it have left the tree), since a background
    group reading the terminal is stopped by ``SIGTTIN``, not waiting. A thread counts when it
    sleeps (state ``S``) in a read of a descriptor that is the source, or in ``select``/``poll``
    watching one for reading (the watched set read from ``/proc/<pid>/mem``; where memory
    cannot be read, a ``select`` of descriptor 0 alone, that being the source, still counts).
    Never raises."""
    calls = input_calls()
    if not calls or (source.terminal is None and source.pipe is None):
        return None
    group = _foreground_group(source)
    if source.terminal is not None and group is None:
        return None
    starts = [root_pid] if group in (None, root_pid) else [root_pid, group]
    for pid, threads in _session_processes(starts):
        how = _how_blocked(source, pid, threads, group, calls)
        if how is not None:
            return pid, how
    return None


def _read(path: str) -> str | None:
    """A small /proc file's text (up to 4 KiB: a stat or syscall line); ``None`` when it is
    gone or may not be read. ``os.open``, not ``open``: a check of hundreds of sessions reads
    hundreds of these, and the file object's layers would double the cost."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 4096).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _children(pid: int, tid: int) -> list[int]:
    """The children thread ``tid`` of ``pid`` forked (read whole: a shell may have many)."""
    try:
        fd = os.open(f"/proc/{pid}/task/{tid}/children", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return [int(child) for child in b"".join(chunks).split()]
    except (OSError, ValueError):
        return []
    finally:
        os.close(fd)


def _threads(pid: int) -> list[int]:
    """``pid``'s thread ids; none when it is gone. A task folder's link count is two plus its
    threads, so the common single-threaded process costs a ``stat``, not a listing."""
    try:
        if os.stat(f"/proc/{pid}/task").st_nlink == 3:
            return [pid]
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):
        return []


def _session_processes(starts: list[int]) -> Iterator[tuple[int, list[int]]]:
    """The processes of ``starts``' trees, each once, with their threads (a vanished one is
    left out, its children with it)."""
    stack, seen = list(reversed(starts)), set[int]()
    while stack and len(seen) < _MOST_PROCESSES:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        threads = _threads(pid)
        if not threads:
            continue
        yield pid, threads
        for tid in threads:
            stack.extend(_children(pid, tid))


def _foreground_group(source: InputSource) -> int | None:
    """The terminal's foreground process group; ``None`` for a pipe, or when the terminal is
    gone (its master closed or hung up)."""
    if source.terminal is None or source.master_fd is None:
        return None
    try:
        return os.tcgetpgrp(source.master_fd)
    except OSError:
        return None


def _sleeping_in(pid: int, tid: int, group: int | None) -> tuple[int, int] | None:
    """The controlling terminal (major, minor) of a thread that sleeps (``S``; not stopped,
    not in uninterruptible I/O) and is of process group ``group`` (any, if ``None``); ``None``
    for any other thread. The command name may hold spaces and ')': fields follow the last."""
    text = _read(f"/proc/{pid}/task/{tid}/stat")
    if not text or ")" not in text:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    try:
        state, in_group, tty = fields[0], int(fields[2]), int(fields[4])
    except (IndexError, ValueError):
        return None
    if state != "S" or (group is not None and in_group != group):
        return None
    return os.major(tty), os.minor(tty)


def _how_blocked(
    source: InputSource,
    pid: int,
    threads: list[int],
    group: int | None,
    calls: Mapping[int, InputCall],
) -> str | None:
    """How one of ``pid``'s threads is blocked reading ``source``, if one is. The syscall line
    comes first, as most threads are in no input call at all and need no more reading. It is
    read again after the descriptors were looked at, and must not have changed: a thread that
    woke meanwhile may have left other memory and descriptors behind."""
    for tid in threads:
        path = f"/proc/{pid}/task/{tid}/syscall"
        line = _read(path) or ""
        number = line.partition(" ")[0]  # most are in no input call: parse no further
        if not number.isdigit() or int(number) not in calls:
            continue
        call = parse_syscall(line)
        if call is None:
            continue
        terminal = _sleeping_in(pid, tid, group)
        if terminal is None:
            continue
        if not _runs_native_code(pid):
            return None  # a 32-bit program's numbers are another table's
        how = _reading_source(source, pid, terminal, call, calls[call.number])
        if how is not None and _read(path) == line:
            return how
    return None


def _runs_native_code(pid: int) -> bool:
    """Whether ``pid`` runs a 64-bit program, whose calls the native table numbers (a 32-bit
    one's ``read`` would be another number, and the number 0 another call)."""
    try:
        fd = os.open(f"/proc/{pid}/exe", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return os.read(fd, 5) == b"\x7fELF\x02"
    except OSError:
        return False
    finally:
        os.close(fd)


def _reading_source(
    source: InputSource, pid: int, terminal: tuple[int, int], call: BlockedCall, known: InputCall
) -> str | None:
    fds = _watched_fds(pid, call, known.shape)
    for fd in fds:
        if _is_source(source, pid, fd, terminal):
            return f"{known.name}(fd {fd})"
    return None


def _watched_fds(pid: int, call: BlockedCall, shape: CallShape) -> list[int]:
    """The descriptors a blocked call waits to read. Where a ``select``'s set cannot be read
    from memory, only a ``select`` of descriptor 0 alone is clear enough to count."""
    if shape is CallShape.READ:
        return [call.args[0]]
    if shape is CallShape.FD_SET:
        nfds, address = call.args[0], call.args[1]
        found = _selected_fds(pid, nfds=nfds, address=address)
        if found is None:
            return [0] if nfds == 1 and address != 0 else []
        return found
    return _polled_fds(pid, address=call.args[0], nfds=call.args[1]) or []


def _read_memory(pid: int, address: int, size: int) -> bytes | None:
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.pread(fd, size, address)
    except (OSError, OverflowError, ValueError):
        return None
    finally:
        os.close(fd)
    return data if len(data) == size else None


def _selected_fds(pid: int, *, nfds: int, address: int) -> list[int] | None:
    """The descriptors in a ``select``'s read set; ``None`` when it cannot be read."""
    if address == 0:
        return []
    if not 0 < nfds <= _MOST_FDS:
        return None
    data = _read_memory(pid, address, (nfds + 63) // 64 * 8)
    if data is None:
        return None
    bits = int.from_bytes(data, "little")  # x86_64 and aarch64 are little-endian
    return [fd for fd in range(nfds) if bits >> fd & 1]


def _polled_fds(pid: int, *, address: int, nfds: int) -> list[int] | None:
    """The descriptors a ``poll`` watches for reading; ``None`` when they cannot be read."""
    if not 0 < nfds <= _MOST_FDS or address == 0:
        return None
    data = _read_memory(pid, address, nfds * 8)
    if data is None:
        return None
    return [
        fd for fd, events, _ in struct.iter_unpack("<ihh", data) if fd >= 0 and events & _POLL_READ
    ]


def _is_source(source: InputSource, pid: int, fd: int, terminal: tuple[int, int]) -> bool:
    """Whether ``pid``'s descriptor ``fd`` is ``source``: the same pipe inode, the same slave
    device, or ``/dev/tty`` while the slave is ``pid``'s controlling terminal."""
    try:
        found = os.stat(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return False
    if source.pipe is not None:
        return stat.S_ISFIFO(found.st_mode) and (found.st_dev, found.st_ino) == source.pipe
    if source.terminal is None or not stat.S_ISCHR(found.st_mode):
        return False
    device = (os.major(found.st_rdev), os.minor(found.st_rdev))
    return device == source.terminal or (device == _DEV_TTY and terminal == source.terminal)


# ---------------------------------------------------------------------------------------------
# What the wait is for


_YES_NO = re.compile(r"\b(y|yes)\s*/\s*(n|no)\b|\by(es)? or n(o)?\b", re.IGNORECASE)
_SECRET = re.compile(r"\b(password|passphrase|passcode|pin)\b", re.IGNORECASE)
_PROMPT_ENDS = (">", "$", "#", "%", ":")


def classify(source: InputSource, last_line: str) -> WaitKind:
    """What a process reading ``source`` after printing ``last_line`` seems to want.

    In order: a terminal with echo off but still line by line -> ``password`` (what ``read
    -s``, ``getpass``, ``sudo`` and ``ssh`` do); a yes/no choice (``[y/N]``, ``(yes/no)``) ->
    ``question``, before the words, so "Save password? [y/N]" is a question; a line naming a
    password, passphrase, passcode or PIN -> ``password``; a line ending in ``?`` ->
    ``question``; a prompt-like ending (``>>>``, ``... ``, ``>``, ``$``, ``#``, ``%``, ``:``)
    or a terminal out of line mode (a raw-mode program: a REPL's line editor, a full-screen
    program) -> ``prompt``; else ``input``."""
    modes = _terminal_modes(source)
    if modes is not None and not modes & termios.ECHO and modes & termios.ICANON:
        return WaitKind.password
    text = last_line.rstrip()
    if _YES_NO.search(text):
        return WaitKind.question
    if _SECRET.search(text):
        return WaitKind.password
    if text.endswith("?"):
        return WaitKind.question
    raw = modes is not None and not modes & termios.ICANON
    if raw or text.endswith(_PROMPT_ENDS) or last_line.endswith("... "):
        return WaitKind.prompt
    return WaitKind.input


def _terminal_modes(source: InputSource) -> int | None:
    """The terminal's local modes (``c_lflag``); ``None`` for a pipe or a closed terminal."""
    if source.master_fd is None:
        return None
    try:
        modes = termios.tcgetattr(source.master_fd)[3]
    except (termios.error, OSError):
        return None
    return modes if isinstance(modes, int) else None


# ---------------------------------------------------------------------------------------------
# Episodes


_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves, modes
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC: window titles, hyperlinks
    r"|\x1b[PX^_].*?\x1b\\"  # DCS, SOS, PM, APC strings
    r"|\x1b[ -/]*[0-~]"  # two-character escapes: charsets, keypad modes
    r"|\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*|[ -/]*)$",  # an escape cut off by the chunk's end
    re.DOTALL,
)
_CONTROLS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f\x80-\x9f]")


def _visible(raw_line: str) -> str:
    """What a terminal shows of one line, roughly: escapes and controls gone, and of text
    overwritten after a carriage return (a progress bar, a redrawn prompt) the last part."""
    parts = [_CONTROLS.sub("", part) for part in _ANSI.sub("", raw_line).split("\r")]
    shown = next((part for part in reversed(parts) if part), "")
    return shown[-_LAST_LINE_CHARS:]


class _LastLine:
    """The last non-blank line of a stream of output chunks, split anywhere (in a line, in a
    UTF-8 character, in an escape sequence)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._current = ""
        self._previous = ""

    def add(self, output: bytes | str) -> None:
        text = output if isinstance(output, str) else self._decoder.decode(output)
        *ended, current = (self._current + text).split("\n")
        for line in reversed(ended):
            if (shown := _visible(line)).strip():
                self._previous = shown
                break
        self._current = current[-_KEPT_RAW_CHARS:]

    @property
    def text(self) -> str:
        shown = _visible(self._current)
        return shown if shown.strip() else self._previous


class InputWaitWatch:
    """Per-session episode logic: fires at most once per waiting episode.

    An episode starts when a reader is seen blocked on the session's input and ends with new
    output, input sent, or the reader seen not blocked. It fires once the same reader was seen
    blocked in two checks at least ``settle_s`` apart with nothing in between, so a process
    that reads input it already has, or a prompt still being drawn, is not reported."""

    def __init__(self, source: InputSource, root_pid: int, *, settle_s: float = 0.25) -> None:
        self._source = source
        self._root_pid = root_pid
        self._settle_s = settle_s
        self._last_line = _LastLine()
        self._seen: tuple[int, float] | None = None
        self._fired = False

    @property
    def last_line(self) -> str:
        """The last non-blank line of output so far, as a ``Waiting`` would carry it."""
        return self._last_line.text

    @property
    def fired(self) -> bool:
        """Whether this episode's ``Waiting`` was given (and the episode is not over)."""
        return self._fired

    def note_output(self, output: bytes | str) -> None:
        """New output arrived, as it came (a chunk of any size, split anywhere; bytes are
        UTF-8): the episode is over, and the last line is remembered."""
        self._last_line.add(output)
        self._end_episode()

    def note_input(self) -> None:
        """Input was sent: the episode is over (the reader has something to read)."""
        self._end_episode()

    def check(self, now: float) -> Waiting | None:
        """Look at the session now (``now``: a monotonic clock's seconds); call every ~0.2 s.
        A ``Waiting`` the first time an episode has settled, else ``None``. Never raises."""
        found = blocked_reader(self._source, self._root_pid)
        if found is None:
            self._end_episode()
            return None
        pid, how = found
        if self._seen is None or self._seen[0] != pid:
            self._seen, self._fired = (pid, now), False
            return None
        if self._fired or now - self._seen[1] < self._settle_s:
            return None
        self._fired = True
        line = self.last_line
        return Waiting(pid, classify(self._source, line), line, how)

    def _end_episode(self) -> None:
        self._seen, self._fired = None, False
