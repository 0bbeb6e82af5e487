"""A child's stdout and stderr as files it writes itself (issue 28; docs/design.md §14.1).

Why files and not pipes: a pipe needs a live reader. When the supervisor that reads a child's
pipes dies, the child's next write meets ``EPIPE``/``SIGPIPE`` and a chatty child dies with its
keeper. Here the supervisor opens two files (``O_WRONLY | O_APPEND | O_CREAT``, ``0600``) in the
process's output folder (``adapters.output_files.folder_for``, as today's capture names it) and
hands them to the child as its fd 1 and 2. Nothing sits between the child and the disk: a dead
supervisor slows no child and loses no byte, and a restarted one picks up from the files.

Three jobs remain for whoever keeps the files, none of them on the child's path:

- **Following** (``Follower``): new bytes as they are appended, for ``logs -f``, output
  readiness probes and the bound. One inotify descriptor (``inotify_init1`` through ``ctypes``)
  watches every file of every child, with ``IN_MODIFY | IN_CLOSE_WRITE``: an event loop puts that
  one fd in its selector and sleeps until a file changes, so a thousand idle children cost
  nothing and no thread or timer per child exists. The kernel coalesces a burst of identical
  events, so a chatty child costs one wake-up per loop pass, not one per write. Where inotify is
  missing (macOS) a stat poll every ``POLL_INTERVAL`` seconds stands in: ``Follower.timeout()``
  tells the loop how long it may sleep.
- **The bound on kept bytes** (``OutputFiles.enforce_bound``): past ``limit`` bytes kept, the
  oldest are dropped with ``fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)`` on whole
  file-system blocks. The file's size and every byte offset stay where they were (``logs
  --since-offset N`` keeps meaning the same bytes) while the disk holds at most the limit and a
  block or two per stream. Dropped bytes are always a prefix: ``[0, kept_from)``.
- **The kept range** (``kept_from``): ``lseek(fd, 0, SEEK_DATA)``, the first byte that is not a
  hole, derived from the file alone (no sidecar to lose or to disagree with it). The kernel reads a
  hole as zeros; every read here asks for the kept range before *and after* reading and reports
  what fell below it as dropped (``Update.dropped``), never as zeros -- a punch racing a read only
  ever moves ``kept_from`` forward, so bytes at or past the second answer were read intact.

Where holes cannot be punched (macOS, file systems without ``PUNCH_HOLE``, or ones whose
``SEEK_DATA`` does not find a punched block's end exactly), the bound is **not enforced**, and
that is said, never silent: ``probe_hole_punching`` checks the folder's file system once with a
scratch file, ``OutputFiles.unbounded`` keeps the reason, and the summary carries it. The files
then keep every byte. Nothing else is honest: the child's descriptor cannot be moved to another
file, and truncating a copy (logrotate's ``copytruncate``) would move every offset and lose the
bytes written between the copy and the truncate.

What files cannot give, and pipes did: the interleaving of stdout and stderr. Each stream keeps
its own exact offsets; the order between them is only as fine as a follower saw it.

Readers (``read_output``, ``logs``) find this layout through ``output_files.OutputReader``,
which tells it from the segment layout by the two file names and reads it with ``read_range``
(``stream_facts`` for a salvage's totals). That is why this module, the lower of the two,
defines the names both layouts share (``STREAMS``, ``TAIL_BYTES``) and imports nothing of ours.

Standard library only: this is the agent's hot path, and the anchor may load it.
"""

from __future__ import annotations

import base64
import errno
import os
import shutil
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, NamedTuple

__all__ = [
    "IN_MODIFY",
    "IN_MOVED_TO",
    "IN_Q_OVERFLOW",
    "POLL_INTERVAL",
    "READ_MAX",
    "STREAMS",
    "TAIL_BYTES",
    "Follower",
    "OutputFacts",
    "OutputFiles",
    "StreamFacts",
    "Update",
    "check_hole_punching",
    "inotify_events",
    "inotify_on",
    "kept_from",
    "open_output_files",
    "probe_hole_punching",
    "read_range",
    "stream_facts",
    "stream_paths",
]

STREAMS: Final = ("stdout", "stderr")
"""The two streams, in the order every per-stream pair is given (stream 0, stream 1); the
segment layout (``output_files``) uses the same names."""

TAIL_BYTES: Final = 8 * 1024
"""The last bytes of each stream the ledger keeps at the end of a run, in either layout."""

POLL_INTERVAL: Final = 0.1
"""Seconds between two looks of the stat-poll fallback (no inotify): the lag a follower adds,
and ~3 µs of CPU per watched file per look (1,000 files: 2.9% of a core)."""

READ_MAX: Final = 1024 * 1024
"""Bytes a follower reads of one file in one pass; more stays pending for the next pass, so one
flooding child cannot starve the other files of an event loop."""

_FILE_MODE: Final = 0o600
_OPEN_FLAGS: Final = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
_FALLOC_FL_KEEP_SIZE: Final = 0x01
_FALLOC_FL_PUNCH_HOLE: Final = 0x02
IN_MODIFY: Final = 0x002
IN_MOVED_TO: Final = 0x080
IN_Q_OVERFLOW: Final = 0x4000
_IN_CLOSE_WRITE: Final = 0x008
_IN_IGNORED: Final = 0x8000
_IN_NONBLOCK: Final = os.O_NONBLOCK
_IN_CLOEXEC: Final = os.O_CLOEXEC
_EVENT: Final = struct.Struct("iIII")
_PROBE_NAME: Final = ".punch-probe"


# --- the libc seam: inotify and fallocate through ctypes ------------------------------------


class _Libc:
    """The three libc calls the standard library lacks, typed; ``None`` attributes where this
    OS has none (macOS: neither inotify nor fallocate)."""

    def __init__(self) -> None:
        import ctypes  # noqa: PLC0415 -- here, not at import: reading output (logs) needs none

        lib = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
        self.inotify_init1 = getattr(lib, "inotify_init1", None)
        self.inotify_add_watch = getattr(lib, "inotify_add_watch", None)
        self.inotify_rm_watch = getattr(lib, "inotify_rm_watch", None)
        self.fallocate = getattr(lib, "fallocate64", None) or getattr(lib, "fallocate", None)
        if self.inotify_add_watch is not None:
            self.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        if self.fallocate is not None:
            self.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]

    @property
    def has_inotify(self) -> bool:
        return self.inotify_init1 is not None and self.inotify_add_watch is not None


_LIBC: _Libc | None = None


def _libc() -> _Libc:
    """Loaded on first use: opening files for a spawn needs none of it."""
    global _LIBC  # noqa: PLW0603 -- one handle per process, made lazily
    if _LIBC is None:
        _LIBC = _Libc()
    return _LIBC


def _check(result: int, what: str, path: Path | None = None) -> int:
    """``result`` of a libc call, or the ``OSError`` its ``errno`` names."""
    if result < 0:
        import ctypes  # noqa: PLC0415 -- loaded already by _Libc, which made the call

        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}", None if path is None else str(path))
    return result


def inotify_on(path: Path, mask: int) -> int:
    """A new non-blocking, close-on-exec inotify descriptor watching ``path`` for ``mask``
    (the web view's folder watch); ``OSError`` where inotify is missing or the watch fails."""
    libc = _libc()
    if not libc.has_inotify:
        raise OSError(errno.ENOSYS, "inotify is not available on this OS")
    assert libc.inotify_init1 is not None
    assert libc.inotify_add_watch is not None
    fd = _check(libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC), "inotify_init1")
    try:
        _check(libc.inotify_add_watch(fd, os.fsencode(path), mask), "watch", path)
    except OSError:
        os.close(fd)
        raise
    return fd


def inotify_events(fd: int) -> list[tuple[int, int, bytes]]:
    """Every event queued on a non-blocking inotify descriptor now, each as ``(watch, mask,
    name)`` (``name`` empty for a watched file itself); never blocks."""
    events: list[tuple[int, int, bytes]] = []
    while True:
        try:
            raw = os.read(fd, 64 * 1024)
        except BlockingIOError:
            return events
        at = 0
        while at + _EVENT.size <= len(raw):
            wd, mask, _cookie, length = _EVENT.unpack_from(raw, at)
            name = raw[at + _EVENT.size : at + _EVENT.size + length].rstrip(b"\0")
            at += _EVENT.size + length
            events.append((wd, mask, name))


def punch_hole(fd: int, length: int) -> None:
    """Deallocate ``[0, length)`` of ``fd``'s file, keeping its size (a no-op for 0 bytes).
    Raises ``OSError`` (``EOPNOTSUPP`` where the file system cannot)."""
    call = _libc().fallocate
    if call is None:
        raise OSError(errno.EOPNOTSUPP, "fallocate: not available on this OS")
    if length > 0:
        _check(call(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, 0, length), "fallocate")


# --- opening and reading ----------------------------------------------------------------------


def stream_paths(folder: Path) -> tuple[Path, Path]:
    """The stdout and stderr files of a process's output folder: one file per stream, named
    by the stream (today's segment files are ``stdout.<hex>``; no name is shared)."""
    return (folder / STREAMS[0], folder / STREAMS[1])


def open_output_files(folder: Path) -> tuple[int, int]:
    """Make ``folder`` (``0700``; an existing one is a stale run's under this id and is
    cleared, as today's capture does) and open its two files for a child to inherit as fd 1
    and 2. The descriptors are close-on-exec (a spawn's ``dup2`` onto 1 and 2 clears it there
    only); the caller closes them once the child is spawned. Raises ``OSError``."""
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        shutil.rmtree(folder)
        folder.mkdir(mode=0o700)
    os.chmod(folder, 0o700)
    out = os.open(stream_paths(folder)[0], _OPEN_FLAGS, _FILE_MODE)
    try:
        err = os.open(stream_paths(folder)[1], _OPEN_FLAGS, _FILE_MODE)
    except OSError:
        os.close(out)
        raise
    return out, err


def kept_from(fd: int) -> int:
    """The first offset of ``fd``'s file not dropped: where its first data begins
    (``SEEK_DATA``), or its size when it holds no data at all. Writes with ``O_APPEND`` leave no
    holes, so the only holes are the punched prefix. 0 where the OS has no ``SEEK_DATA``."""
    size = os.fstat(fd).st_size
    seek_data = getattr(os, "SEEK_DATA", None)
    if size == 0 or seek_data is None:
        return 0
    try:
        return min(os.lseek(fd, 0, seek_data), size)
    except OSError as error:
        if error.errno == errno.ENXIO:  # no data past 0: all of it was punched
            return size
        raise


class Update(NamedTuple):
    """New bytes of a followed file: ``data`` starts at byte ``offset`` of the stream; the
    ``dropped`` bytes just before it, ``[offset - dropped, offset)``, were dropped to keep the
    bound before anyone read them (they are never reported as data). A size-only watch reports
    ``data`` empty and ``offset`` where the file ends now."""

    path: Path
    offset: int
    data: bytes
    dropped: int = 0


def read_range(fd: int, path: Path, start: int, end: int, most: int | None = None) -> Update:
    """Bytes ``[start, end)`` of ``fd``'s file as far as they are kept (at most ``most`` of
    them, from the first kept): what lies below the kept range is counted as dropped, even when
    it is punched while this reads (the range is asked again after the read, and a punch only
    moves it forward)."""
    first = kept_from(fd)
    begin = max(start, min(first, end))
    if most is not None:
        end = min(end, begin + most)
    data = os.pread(fd, end - begin, begin) if end > begin else b""
    after = kept_from(fd)
    if after > begin:
        cut = min(after - begin, len(data))
        data, begin = data[cut:], begin + cut
    return Update(path, begin, data, begin - start)


# --- following --------------------------------------------------------------------------------


class _Inotify:
    """One inotify descriptor for every watched file. inotify watches inodes: two paths of one
    file share a watch descriptor, so each maps to the set of keys watching it."""

    interval: float | None = None

    def __init__(self) -> None:
        libc = _libc()
        if not libc.has_inotify:
            raise OSError(errno.ENOSYS, "inotify is not available on this OS")
        assert libc.inotify_init1 is not None
        self._libc = libc
        self._fd = _check(libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC), "inotify_init1")
        self._keys: dict[int, set[Path]] = {}
        self._wd_of: dict[Path, int] = {}

    def fileno(self) -> int:
        return self._fd

    def add(self, key: Path) -> None:
        assert self._libc.inotify_add_watch is not None
        mask = IN_MODIFY | _IN_CLOSE_WRITE
        wd = _check(self._libc.inotify_add_watch(self._fd, os.fsencode(key), mask), "watch", key)
        self._keys.setdefault(wd, set()).add(key)
        self._wd_of[key] = wd

    def remove(self, key: Path) -> None:
        wd = self._wd_of.pop(key, None)
        if wd is None:  # its file went and the kernel dropped the watch (IN_IGNORED)
            return
        keys = self._keys.get(wd, set())
        keys.discard(key)
        if not keys and self._keys.pop(wd, None) is not None:
            assert self._libc.inotify_rm_watch is not None
            self._libc.inotify_rm_watch(self._fd, wd)  # EINVAL if the file went: nothing to undo

    def changed(self) -> set[Path]:
        """The keys whose files changed since the last call (all of them after a queue
        overflow, which loses events); never blocks."""
        found: set[Path] = set()
        for wd, mask, _name in inotify_events(self._fd):
            if mask & IN_Q_OVERFLOW:
                found.update(self._wd_of)
            elif mask & _IN_IGNORED:  # the file is gone: the kernel dropped the watch
                for key in self._keys.pop(wd, set()):
                    self._wd_of.pop(key, None)
            else:
                found |= self._keys.get(wd, set())
        return found

    def close(self) -> None:
        os.close(self._fd)


class _StatPoll:
    """The fallback without inotify: every ``interval`` seconds, a file whose size changed is
    reported. Its descriptor (a pipe nobody writes) only gives a selector something to hold; the
    loop's timeout (``Follower.timeout``) is what wakes it."""

    def __init__(self, interval: float) -> None:
        self.interval: float | None = interval
        self._read, self._write = os.pipe()
        self._sizes: dict[Path, int] = {}

    def fileno(self) -> int:
        return self._read

    def add(self, key: Path) -> None:
        self._sizes[key] = -1

    def remove(self, key: Path) -> None:
        del self._sizes[key]

    def changed(self) -> set[Path]:
        found = set()
        for key, size in self._sizes.items():
            try:
                now = os.stat(key).st_size
            except OSError:
                continue
            if now != size:
                self._sizes[key] = now
                found.add(key)
        return found

    def close(self) -> None:
        os.close(self._read)
        os.close(self._write)


@dataclass(slots=True)
class _Watch:
    path: Path
    fd: int
    position: int
    data: bool


Backend = Literal["inotify", "poll"]


class Follower:
    """Reports the bytes appended to many files, from an offset each, to one event loop.

    The loop holds ``fileno()`` in its selector, sleeps at most ``timeout()`` seconds, and calls
    ``read_ready()`` after each wake-up (whether or not the fd was ready: that is how the poll
    fallback and pending reads are served). Not thread-safe: the loop's thread is its caller.
    Each watched file holds one read-only descriptor (a file renamed or removed under it is
    still read whole): an agent following 1,000 children's two streams needs ``RLIMIT_NOFILE``
    above 2,000 (the usual soft limit is 1,024) and as many inotify watches.
    """

    def __init__(
        self, backend: Backend | None = None, *, poll_interval: float = POLL_INTERVAL
    ) -> None:
        """``backend`` None: inotify where this OS has it, else the stat poll (every
        ``poll_interval`` s). Raises ``OSError`` when inotify cannot start (the per-user limit
        of instances, ``fs.inotify.max_user_instances``, is spent)."""
        if backend is None:
            backend = "inotify" if _libc().has_inotify else "poll"
        self.backend: Backend = backend
        self._source = _Inotify() if backend == "inotify" else _StatPoll(poll_interval)
        self._watches: dict[Path, _Watch] = {}
        self._pending: set[Path] = set()

    def fileno(self) -> int:
        """The one descriptor to select on for reading, whatever the number of files."""
        return self._source.fileno()

    def timeout(self) -> float | None:
        """How long the loop may sleep before ``read_ready``: 0 while reads are pending,
        the poll interval without inotify, else None (until the fd is ready)."""
        return 0.0 if self._pending else self._source.interval

    def watch(self, path: Path, from_offset: int = 0, *, data: bool = True) -> None:
        """Report ``path``'s bytes from ``from_offset`` on (what is there already comes at the
        next ``read_ready``); ``data`` False: only where it ends (for the bound, without
        reading). Raises ``OSError`` (a missing file), ``ValueError`` (already watched)."""
        if path in self._watches:
            raise ValueError(f"{path} is already followed: unwatch it first")
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._source.add(path)
        except OSError:
            os.close(fd)
            raise
        self._watches[path] = _Watch(path, fd, from_offset, data)
        self._pending.add(path)

    def unwatch(self, path: Path) -> None:
        """Stop following ``path`` (its descriptor is closed); unknown paths are ignored."""
        watch = self._watches.pop(path, None)
        if watch is not None:
            self._source.remove(path)
            self._pending.discard(path)
            os.close(watch.fd)

    def position(self, path: Path) -> int:
        """The offset up to which ``path`` has been reported."""
        return self._watches[path].position

    def read_ready(self) -> list[Update]:
        """What was appended since the last report, per changed file (at most ``READ_MAX``
        bytes of each: the rest is pending, see ``timeout``); never blocks."""
        changed = self._source.changed() | self._pending
        self._pending = set()
        updates = []
        for path in changed:
            watch = self._watches.get(path)
            update = None if watch is None else self._advance(watch)
            if update is not None:
                updates.append(update)
        return updates

    def _advance(self, watch: _Watch) -> Update | None:
        size = os.fstat(watch.fd).st_size
        if size <= watch.position:
            return None
        if not watch.data:
            watch.position = size
            return Update(watch.path, size, b"")
        update = read_range(watch.fd, watch.path, watch.position, size, READ_MAX)
        watch.position = update.offset + len(update.data)
        if watch.position < size:
            self._pending.add(watch.path)
        return update

    def close(self) -> None:
        """Close every descriptor of the follower."""
        for path in list(self._watches):
            self.unwatch(path)
        self._source.close()

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


# --- the bound on kept bytes ------------------------------------------------------------------


_PUNCHING_DEVICES: set[int] = set()
"""File systems (``st_dev``) found to punch exact holes: probed once per agent, not per child."""


def probe_hole_punching(folder: Path) -> str | None:
    """``check_hole_punching`` once per file system: a success is remembered by device (a
    failure is not: a full disk may have failed the scratch file)."""
    try:
        device = os.stat(folder).st_dev
    except OSError as error:
        return f"cannot probe hole punching in {folder}: {error}"
    if device in _PUNCHING_DEVICES:
        return None
    reason = check_hole_punching(folder)
    if reason is None:
        _PUNCHING_DEVICES.add(device)
    return reason


def check_hole_punching(folder: Path) -> str | None:
    """None when ``folder``'s file system drops a block-aligned prefix with ``PUNCH_HOLE`` and
    ``SEEK_DATA`` then finds exactly where the kept bytes begin; else why not (the bound cannot
    be kept there). Costs one scratch file in ``folder``, removed before it returns."""
    path = folder / _PROBE_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, _FILE_MODE)
    except OSError as error:
        return f"cannot probe hole punching in {folder}: {error}"
    try:
        block = _block_size(fd)
        os.write(fd, b"x" * (3 * block))
        punch_hole(fd, block)
        found = kept_from(fd)
        if found != block:
            return f"SEEK_DATA finds {found} after a punch of [0, {block}): holes are not exact"
        return None
    except OSError as error:
        return f"hole punching unsupported in {folder}: {error.strerror or error}"
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


def _block_size(fd: int) -> int:
    """The unit a punch must be aligned to for the blocks to be freed, not just zeroed."""
    return max(os.fstat(fd).st_blksize, 512)


def plan_allotments(kept: tuple[int, int], budget: int) -> tuple[int, int]:
    """Bytes each stream may keep so both together keep at most ``budget``: a stream within
    half of it keeps all it has, and the other the rest (a chatty stdout never evicts the few
    lines of stderr that say why a run failed); both over half: half each."""
    half = budget // 2
    small = min(kept)
    if small <= half:
        big = budget - small
        return (kept[0], big) if kept[0] == small else (big, kept[1])
    return (half, budget - half)


def plan_kept_from(size: int, allotment: int, block: int, current: int) -> int:
    """Where a stream of ``size`` bytes should begin to keep at most ``allotment`` bytes:
    rounded up to a block (a partial block can only be zeroed, never freed), never past the
    block that holds its end (the child's next write lands there), never backwards."""
    wanted = -(-(size - allotment) // block) * block
    return max(current, min(wanted, size // block * block))


class OutputFiles:
    """One process's two output files as the agent keeps them: their paths, the bound on the
    bytes kept on disk across both (``limit``), and whether the bound can be kept here.

    Made for a spawn (after ``open_output_files``) or for an adoption by a restarted agent:
    the kept ranges are read from the files themselves, so nothing is lost with the agent.
    ``limit`` 0 (keep nothing) is better served by no files at all: the child gets
    ``/dev/null``, as today's capture keeps nothing then.
    """

    def __init__(
        self,
        folder: Path,
        limit: int,
        *,
        probe: Callable[[Path], str | None] = probe_hole_punching,
    ) -> None:
        """``probe``: the capability check (its reason, or None when holes can be punched).
        Raises ``OSError`` when the files cannot be read, ``ValueError`` for a negative
        ``limit``."""
        if limit < 0:
            raise ValueError(f"output limit {limit} is negative: give 0 or more bytes")
        self.folder = folder
        self.limit = limit
        self.paths = stream_paths(folder)
        self.unbounded: str | None = probe(folder)
        self._kept_from = [0, 0]
        self._block = 4096
        for stream, path in enumerate(self.paths):
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                self._kept_from[stream] = kept_from(fd)
                self._block = _block_size(fd)
            finally:
                os.close(fd)

    def enforce_bound(self) -> int:
        """Drop the oldest bytes while more than ``limit`` are kept, down to 7/8 of it (so a
        chatty child costs one punch per ``limit/8`` bytes, not one per write); the bytes dropped
        now. Never raises: a punch that fails marks the bound not kept (``unbounded``)."""
        if self.unbounded is not None:
            return 0
        try:
            sizes = (os.stat(self.paths[0]).st_size, os.stat(self.paths[1]).st_size)
        except OSError as error:
            self.unbounded = f"output files unreadable, the bound is not kept: {error}"
            return 0
        kept = (sizes[0] - self._kept_from[0], sizes[1] - self._kept_from[1])
        if sum(kept) <= self.limit:
            return 0
        allotments = plan_allotments(kept, self.limit - self.limit // 8)
        return sum(self._trim(s, sizes[s], allotments[s]) for s in (0, 1))

    def _trim(self, stream: int, size: int, allotment: int) -> int:
        target = plan_kept_from(size, allotment, self._block, self._kept_from[stream])
        if target <= self._kept_from[stream]:
            return 0
        try:
            fd = os.open(self.paths[stream], os.O_WRONLY | os.O_CLOEXEC)
            try:
                punch_hole(fd, target)
            finally:
                os.close(fd)
        except OSError as error:
            self.unbounded = f"punching {self.paths[stream].name} failed: {error}"
            return 0
        dropped, self._kept_from[stream] = target - self._kept_from[stream], target
        return dropped

    def summarize(self) -> OutputFacts:
        """The facts the ledger records of the output (``OutputFacts.summary_fields``): read
        from the files as they are now (the child may still be writing)."""
        streams = [stream_facts(path) for path in self.paths]
        missing = [str(p) for p, s in zip(self.paths, streams, strict=True) if s is None]
        return OutputFacts(
            folder=self.folder,
            limit=self.limit,
            stdout=streams[0] or StreamFacts(0, 0, 0, b""),
            stderr=streams[1] or StreamFacts(0, 0, 0, b""),
            stopped=f"output files gone: {', '.join(missing)}" if missing else None,
            unbounded=self.unbounded,
        )


def stream_facts(path: Path) -> StreamFacts | None:
    """Written, kept, dropped and the tail of one stream's file; None if it is gone. Also what
    ``OutputReader.totals`` gives of a direct-layout folder whose agent can no longer say."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        tail = read_range(fd, path, max(0, size - TAIL_BYTES), size)
        first = kept_from(fd)
    finally:
        os.close(fd)
    return StreamFacts(size, size - first, first, tail.data)


@dataclass(frozen=True, slots=True)
class StreamFacts:
    """One stream: bytes the child wrote (the file's size), kept on disk, dropped (the prefix
    ``[0, dropped)``), and the last ``TAIL_BYTES`` kept."""

    written: int
    kept: int
    dropped: int
    tail: bytes


@dataclass(frozen=True, slots=True)
class OutputFacts:
    """A run's output facts. ``stopped``: why the files could not be read whole; ``unbounded``:
    why ``limit`` was not kept (None: it was) -- the ledger's ``OutputSummary`` has no field
    for it yet (docs/design.md §11 would add one), so the caller records it as well."""

    folder: Path
    limit: int
    stdout: StreamFacts
    stderr: StreamFacts
    stopped: str | None
    unbounded: str | None

    def summary_fields(self, host_id: str | None) -> dict[str, object]:
        """``OutputSummary(**fields)``'s arguments, as the ledger records them today."""
        return {
            "capture": True,
            "host_id": host_id,
            "folder": str(self.folder),
            "limit": self.limit,
            "stdout": _counts(self.stdout),
            "stderr": _counts(self.stderr),
            "stopped": self.stopped,
        }

    def tails(self) -> dict[str, str]:
        """The base64 tails the ledger keeps, by stream name."""
        pairs = zip(STREAMS, (self.stdout, self.stderr), strict=True)
        return {name: base64.b64encode(s.tail).decode() for name, s in pairs}


def _counts(facts: StreamFacts) -> dict[str, int]:
    return {"written": facts.written, "kept": facts.kept, "dropped": facts.dropped}
