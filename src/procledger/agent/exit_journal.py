"""The exit journal: how the anchor hands the agent every exit it reaped, across any crash.

Standard library only: the anchor imports this module, and the anchor must stay a few MB.

**Format.** A journal is a directory. Records are JSON lines, one per line, in *segment* files
``exits-<base>.jsonl``, where ``<base>`` (20 digits) is the *logical offset* of the segment's
first byte. A record's offset is ``base`` plus its position in the segment, so offsets grow
forever and never move: a reader keeps the offset it has delivered up to, and that offset
stays valid whatever is dropped before it. Each line is written by one ``os.write`` of the
whole line to an ``O_APPEND`` descriptor, then ``os.fsync``: once the write returns and the
fsync succeeded, the record survives a crash of the anchor and of the host. One writer at a
time, held by an ``flock`` on ``lock`` in the directory (a second anchor on the same journal
is refused, not interleaved).

**Torn lines.** A crash mid-write, or a short write on a full disk, can leave the last line
without its ``\\n``. The reader stops before it (``next_offset`` is its first byte) and reads
it once it is complete. A writer that finds the newest segment ending without ``\\n`` (its
predecessor died mid-write), or that made a short write itself, starts its next line with a
``\\n``: the fragment becomes a complete line that does not parse, which the reader skips, and
the new record is never glued to it. A complete line that does not parse (such a fragment, or
bytes a host crash left) is skipped and never raises.

**Dropping what was delivered: segments, not rewrites.** The writer rolls to a new segment
once the newest one holds ``segment_bytes`` or more; a segment with a successor is *sealed*:
the writer never writes it again. ``compact(path, upto_offset)`` deletes sealed segments that
end at or before ``upto_offset`` and never touches the newest. Rewriting the live file (copy
the tail, rename over) was rejected: the anchor keeps its descriptor on the old inode after a
rename, so a record it appends between the copy and the rename — or any time after, until it
reopens — lands in an unlinked file and is lost; closing that race needs a lock the anchor
would block on, or a request from reader to anchor, and the offsets would move under the
reader. Hole punching keeps offsets too, but not every file system has it (and macOS spells it
differently). Deleting a sealed segment races with nothing: the anchor holds no interest in it.

**Delivery is at least once.** A record whose fsync failed is written again (the anchor keeps
the zombie, and so its pid, until it is recorded), so a reader may see a record twice:
``(boot_id, pid_ns, pid, start_time)`` names one process for good and is the key to deduplicate
by. ``boot_id`` tells records of an earlier boot, whose pids mean nothing now.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import time
from typing import Any, Final, NamedTuple

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "FORMAT_VERSION",
    "ExitRecord",
    "JournalBusy",
    "JournalWriter",
    "boot_id",
    "compact",
    "pid_namespace",
    "read_exits",
]

FORMAT_VERSION: Final = 1
"""The ``v`` of every line this module writes; lines of another version are skipped."""
DEFAULT_SEGMENT_BYTES: Final = 1 << 20
"""A segment rolls over at 1 MiB: about 5,000 exits, small enough to drop soon after."""
_PREFIX: Final = "exits-"
_SUFFIX: Final = ".jsonl"
_LOCK: Final = "lock"
StrPath = str | os.PathLike[str]


class JournalBusy(RuntimeError):
    """Another writer (another anchor) holds the journal's lock."""


class ExitRecord(NamedTuple):
    """One process that ended and was reaped by the anchor.

    ``exit_code`` is set when it exited, ``signal`` when a signal ended it (``core_dumped``
    then says whether it dumped core); ``start_time`` is field 22 of ``/proc/<pid>/stat`` read
    from the zombie before it was reaped (clock ticks since boot, as ``OsFacts.start_time``),
    ``None`` where ``/proc`` could not say. ``agent`` marks the agent's own exits.
    ``time_ms`` is when the anchor saw the exit (epoch ms). ``offset`` is where the record's
    line begins in the journal (not stored: it is the line's place; ``-1`` before it is
    written). A named tuple, not a dataclass: ``dataclasses`` would cost the anchor ~1 MB."""

    pid: int
    start_time: int | None
    exit_code: int | None
    signal: int | None
    core_dumped: bool
    time_ms: int
    boot_id: str
    pid_ns: int | None
    agent: bool = False
    offset: int = -1

    @property
    def returncode(self) -> int:
        """The ``subprocess`` convention: the exit code, or minus the signal."""
        return self.exit_code if self.exit_code is not None else -(self.signal or 0)

    def to_line(self) -> bytes:
        """The record as one journal line, newline included."""
        fields = self._asdict()
        del fields["offset"]
        text = json.dumps({"v": FORMAT_VERSION, **fields}, separators=(",", ":"))
        return text.encode() + b"\n"


def boot_id() -> str:
    """This boot's id (``/proc/sys/kernel/random/boot_id``), or ``""`` where there is none."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            return file.read().strip()
    except OSError:
        return ""


def pid_namespace() -> int | None:
    """The inode of this process's PID namespace: pids mean something only inside one."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def now_ms() -> int:
    """The wall clock in epoch milliseconds (docs/design.md: times are ``*_ms``)."""
    return time.time_ns() // 1_000_000


# -- reading ---------------------------------------------------------------------------------


def read_exits(path: StrPath, after_offset: int = 0) -> tuple[list[ExitRecord], int]:
    """The complete records at or after ``after_offset``, and the offset to pass next time.

    Never raises on content: an incomplete last line is left for a later call (the returned
    offset is its first byte), a complete line that does not parse is skipped. A missing
    journal, or an offset inside dropped segments, reads what is there. Raises ``OSError``
    only when the directory or a segment exists but cannot be read."""
    segments = _segments(os.fspath(path))
    records: list[ExitRecord] = []
    offset = after_offset
    for index, (base, segment) in enumerate(segments):
        following = segments[index + 1][0] if index + 1 < len(segments) else None
        if following is not None and following <= offset:
            continue
        start = max(offset, base)
        try:
            data = _read_from(segment, start - base)
        except FileNotFoundError:  # dropped by a compaction meanwhile
            continue
        complete = data.rfind(b"\n") + 1
        records.extend(_parse_lines(data[:complete], start))
        if following is None:
            return records, start + complete
        offset = following  # sealed: a torn tail there can never complete
    return records, offset


def _read_from(segment: str, position: int) -> bytes:
    with open(segment, "rb") as file:
        file.seek(position)
        return file.read()


def _parse_lines(data: bytes, offset: int) -> list[ExitRecord]:
    records = []
    for line in data.splitlines(keepends=True):
        record = _parse(line, offset)
        if record is not None:
            records.append(record)
        offset += len(line)
    return records


def _parse(line: bytes, offset: int) -> ExitRecord | None:
    """The record on ``line``, or None for anything that is not one of ours."""
    try:
        fields: Any = json.loads(line)
        if not isinstance(fields, dict) or fields.pop("v", None) != FORMAT_VERSION:
            return None
        record = ExitRecord(**fields, offset=offset)
    except (ValueError, TypeError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None
    return record if _well_typed(record) else None


def _well_typed(record: ExitRecord) -> bool:
    optional_ints = (record.start_time, record.exit_code, record.signal, record.pid_ns)
    return (
        _is_int(record.pid)
        and _is_int(record.time_ms)
        and all(value is None or _is_int(value) for value in optional_ints)
        and isinstance(record.boot_id, str)
        and isinstance(record.core_dumped, bool)
        and isinstance(record.agent, bool)
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# -- dropping --------------------------------------------------------------------------------


def compact(path: StrPath, upto_offset: int) -> int:
    """Drop the sealed segments that end at or before ``upto_offset``; how many were dropped.

    ``upto_offset`` is an offset ``read_exits`` returned once everything before it was
    delivered. The newest segment is never dropped (the writer appends to it), so this is safe
    while the anchor runs. Oldest first: a crash midway leaves a contiguous journal."""
    directory = os.fspath(path)
    segments = _segments(directory)
    dropped = 0
    for (_, segment), (following, _) in itertools.pairwise(segments):
        if following > upto_offset:
            break
        with contextlib.suppress(FileNotFoundError):
            os.unlink(segment)
        dropped += 1
    if dropped:
        _fsync_directory(directory)
    return dropped


def _segments(directory: str) -> list[tuple[int, str]]:
    """The segments, oldest first, each with its base offset."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        digits = name[len(_PREFIX) : -len(_SUFFIX)]
        if name.startswith(_PREFIX) and name.endswith(_SUFFIX) and digits.isdigit():
            found.append((int(digits), os.path.join(directory, name)))
    return sorted(found)


def _segment_name(base: int) -> str:
    return f"{_PREFIX}{base:020d}{_SUFFIX}"


def _fsync_directory(directory: str) -> None:
    """Make a created or deleted name durable (the file's own fsync does not)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- writing (the anchor) --------------------------------------------------------------------


class JournalWriter:
    """The one writer of a journal: appends fsynced records and rolls segments.

    ``open()`` takes the journal's lock (``JournalBusy`` if another writer has it), creates the
    directory (``0700``) and the first segment if needed, and notes a torn tail left by a
    predecessor. ``append`` returns once the record is on disk, or raises ``OSError`` having
    made no promise (the caller keeps what it would have lost and tries again)."""

    def __init__(self, path: StrPath, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        self._directory = os.fspath(path)
        self._segment_bytes = segment_bytes
        self._lock_fd = -1
        self._fd = -1
        self._base = 0
        self._size = 0
        self._torn = False

    def open(self) -> None:
        """Take the lock and open the newest segment for appending."""
        os.makedirs(self._directory, mode=0o700, exist_ok=True)
        lock = os.path.join(self._directory, _LOCK)
        self._lock_fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise JournalBusy(f"another anchor writes the exit journal {self._directory}") from None
        segments = _segments(self._directory)
        self._open_segment(segments[-1][0] if segments else 0)
        self._torn = self._size > 0 and not _ends_with_newline(self._fd, self._size)

    def append(self, record: ExitRecord) -> None:
        """Write ``record`` as one line with one ``os.write``, then fsync; roll if full."""
        line = (b"\n" if self._torn else b"") + record.to_line()
        written = os.write(self._fd, line)
        self._size += written
        if written != len(line):  # a short write (a full disk): the tail is torn now
            self._torn = True
            raise OSError(f"short write to the exit journal ({written} of {len(line)} bytes)")
        self._torn = False
        os.fsync(self._fd)
        if self._size >= self._segment_bytes:
            self._roll()

    def close(self) -> None:
        """Close the segment and release the lock."""
        for fd in (self._fd, self._lock_fd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._lock_fd = -1

    def _open_segment(self, base: int) -> None:
        path = os.path.join(self._directory, _segment_name(base))
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        size = os.fstat(fd).st_size
        if self._fd >= 0:  # switched at once: once the new segment exists, the old is sealed
            os.close(self._fd)
        self._fd, self._base, self._size = fd, base, size
        _fsync_directory(self._directory)

    def _roll(self) -> None:
        """Seal the full segment by starting the next; on failure keep appending here."""
        with contextlib.suppress(OSError):
            self._open_segment(self._base + self._size)


def _ends_with_newline(fd: int, size: int) -> bool:
    return os.pread(fd, 1, size - 1) == b"\n"
