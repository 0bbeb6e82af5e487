"""A process's captured output on disk (docs/design.md §14).

One folder per process under ``<state dir>/output`` (``0700``), named by a hash of the store and
the process id, holding for each stream (``stdout``, ``stderr``) segment files named by the
stream offset of their first byte (``stdout.0000000000000000``), at most ``segment_size`` bytes
each, and an ``order`` file that says how the two streams interleaved: one 9-byte record
(stream number, big-endian start offset) each time the writing stream changes. A run of stream
S that starts at offset a ends where the next run of S starts (or at the stream's end).

Writes are ``os.write`` on ``O_APPEND`` descriptors, nothing buffered in this process, so what
was written before a ``kill -9`` of the writer is readable afterwards, byte for byte.

The folder is made when the run starts (a reader, and a salvage after the writer died, tell a
silent run from one whose output is gone by it); the ``order`` file at the first byte kept, so
a run that writes nothing costs one file create less (a journal write: ~0.1 ms on a quiet disk,
~0.5 ms on a busy one). A reader takes a missing ``order`` file as no runs yet.

The writer never raises: a failed write or a folder that vanished stops capture, and the reason
is kept (``stopped``) for the caller to record. Past ``limit`` bytes kept, the oldest segments
are deleted first, across both streams; the streams' dropped bytes are always a prefix.

The agent's children write the same folder in another layout, two plain files
(``adapters.direct_output``): ``OutputReader`` reads either, so no reader needs to know which
(``DirectReader`` below; what that layout cannot tell, the streams' interleaving, is said there).
"""

from __future__ import annotations

import errno
import os
import shutil
import struct
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from procledger.adapters.direct_output import (
    READ_MAX,
    STREAMS,
    TAIL_BYTES,
    read_range,
    stream_facts,
    stream_paths,
)
from procledger.adapters.state_dir import subdirectory

__all__ = [
    "MAX_SEGMENT",
    "STREAMS",
    "TAIL_BYTES",
    "Chunk",
    "DirectReader",
    "OutputReader",
    "OutputWriter",
    "SegmentReader",
    "StreamTotals",
    "folder_for",
    "output_root",
    "remove_folder",
    "remove_process_output",
]

MAX_SEGMENT: Final = 8 * 1024 * 1024
MIN_SEGMENT: Final = 4096
_ORDER: Final = "order"
_RUN: Final = struct.Struct(">BQ")


def output_root(environ: dict[str, str] | None = None) -> Path:
    """``<state dir>/output``, created ``0700``. Raises ``OSError`` where it cannot be."""
    return subdirectory("output", environ)


def folder_for(root: Path, store: str, process_id: str) -> Path:
    """The folder of ``process_id``'s output in the ledger named ``store`` (not created)."""
    import hashlib  # noqa: PLC0415 -- only where a folder is named: reading a record's does not

    digest = hashlib.sha256(f"{store}\0{process_id}".encode()).hexdigest()[:32]
    return root / digest


def remove_folder(folder: Path) -> bool:
    """Delete a process's output folder; False if there was none."""
    if not folder.is_dir():
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


def remove_process_output(store: str, process_ids: list[str]) -> None:
    """Delete the output folders of ``process_ids`` (pruned from the ledger ``store``) under
    this user's output root; where there is no root there is nothing to delete."""
    try:
        root = output_root()
    except OSError:
        return
    for process_id in process_ids:
        remove_folder(folder_for(root, store, process_id))


def segment_size_for(limit: int) -> int:
    """Segments small enough that the cap is kept to within one of them."""
    return max(MIN_SEGMENT, min(MAX_SEGMENT, limit // 4))


@dataclass(slots=True)
class StreamTotals:
    """One stream: bytes the child wrote, bytes kept on disk, bytes dropped (a prefix), and the
    last ``TAIL_BYTES`` written (empty when nothing is kept)."""

    written: int = 0
    kept: int = 0
    dropped: int = 0
    tail: bytearray = field(default_factory=bytearray)


@dataclass(slots=True)
class _Segment:
    stream: int
    start: int
    length: int
    path: Path


class OutputWriter:
    """Appends one process's output; see the module docstring. Not thread-safe: the owner
    thread that drains the child's pipes is its only caller."""

    def __init__(self, folder: Path, limit: int) -> None:
        self.folder = folder
        self.limit = limit
        self.streams = (StreamTotals(), StreamTotals())
        self.stopped: str | None = None
        self._size = segment_size_for(limit)
        self._segments: deque[_Segment] = deque()
        self._current: list[_Segment | None] = [None, None]
        self._fds: list[int | None] = [None, None]
        self._order: int | None = None
        self._last = -1
        self._kept = 0
        if limit > 0:
            self._guard(self._open_folder)

    def _open_folder(self) -> None:
        try:
            self.folder.mkdir(mode=0o700)
        except FileExistsError:  # a re-run under this id: its old output is stale
            shutil.rmtree(self.folder)
            self.folder.mkdir(mode=0o700)
        os.chmod(self.folder, 0o700)

    def _open_order(self) -> int:
        """The ``order`` file, made at the first byte kept."""
        self._order = os.open(self.folder / _ORDER, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return self._order

    def write(self, stream: int, data: bytes | memoryview) -> None:
        """Keep ``data`` as the next bytes of ``stream`` (0: stdout, 1: stderr); a view is
        only borrowed (nothing of it is kept but a copy of the tail)."""
        totals = self.streams[stream]
        offset = totals.written
        totals.written += len(data)
        if self.limit <= 0:
            totals.dropped += len(data)
            return
        tail = totals.tail
        tail += data[-TAIL_BYTES:]
        if len(tail) > 2 * TAIL_BYTES:
            del tail[:-TAIL_BYTES]
        if self.stopped is None:
            self._guard(lambda: self._append(stream, offset, memoryview(data)))

    def close(self) -> None:
        """Close every descriptor; what was kept stays on disk."""
        for stream in (0, 1):
            self._close_segment(stream)
        if self._order is not None:
            os.close(self._order)
            self._order = None
        for totals in self.streams:
            del totals.tail[:-TAIL_BYTES]

    def _guard(self, action: Callable[[], None]) -> None:
        try:
            action()
        except OSError as error:
            self._stop(error)

    def _stop(self, error: OSError) -> None:
        name = errno.errorcode.get(error.errno or 0, "OSError")
        self.stopped = f"{name}: {error.strerror or error}"
        for stream in (0, 1):
            self._close_segment(stream)

    def _append(self, stream: int, offset: int, data: memoryview) -> None:
        if self._last != stream:
            order = self._order if self._order is not None else self._open_order()
            error = _write_all(order, _RUN.pack(stream, offset))[1]
            if error is not None:
                raise error
            self._last = stream
        while data:
            segment = self._segment(stream, offset)
            fd = self._fds[stream]
            assert fd is not None
            piece = data[: self._size - segment.length]
            written, error = _write_all(fd, piece)
            self._count(segment, written)
            if error is not None:
                raise error
            data, offset = data[len(piece) :], offset + len(piece)
            self._trim()

    def _count(self, segment: _Segment, n: int) -> None:
        segment.length += n
        self.streams[segment.stream].kept += n
        self._kept += n

    def _segment(self, stream: int, offset: int) -> _Segment:
        segment = self._current[stream]
        if segment is not None and segment.length < self._size:
            return segment
        self._close_segment(stream)
        if not self.folder.is_dir():
            raise FileNotFoundError(errno.ENOENT, "the output folder disappeared", str(self.folder))
        path = self.folder / f"{STREAMS[stream]}.{offset:016x}"
        self._fds[stream] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        segment = _Segment(stream, offset, 0, path)
        self._current[stream] = segment
        self._segments.append(segment)
        return segment

    def _close_segment(self, stream: int) -> None:
        fd, self._fds[stream] = self._fds[stream], None
        self._current[stream] = None
        if fd is not None:
            os.close(fd)

    def _trim(self) -> None:
        """Delete the oldest segments while more than ``limit`` bytes are kept."""
        while self._kept > self.limit and self._segments:
            oldest = self._segments.popleft()
            if self._current[oldest.stream] is oldest:
                self._close_segment(oldest.stream)
            oldest.path.unlink(missing_ok=True)
            totals = self.streams[oldest.stream]
            totals.kept -= oldest.length
            totals.dropped += oldest.length
            self._kept -= oldest.length


def _write_all(fd: int, data: memoryview | bytes) -> tuple[int, OSError | None]:
    """Write every byte (a partial write is continued): how many went, and the error that
    stopped it, if any."""
    view, done = memoryview(data), 0
    while done < len(view):
        try:
            done += os.write(fd, view[done:])
        except OSError as error:
            return done, error
    return done, None


@dataclass(frozen=True, slots=True)
class Chunk:
    """Bytes of one stream starting at ``offset`` (bytes since the stream began)."""

    stream: str
    offset: int
    data: bytes


class OutputReader:
    """Reads a process's output folder as it is now (the writer may still be appending), in
    whichever layout its writer left: ``OutputWriter``'s segments and ``order`` file, or the
    two files a child writes itself (``adapters.direct_output``, named plainly ``stdout`` and
    ``stderr``, which no segment is). Callers (``read_output``, ``logs``, a salvage) need not
    know which: the interface, its chunks and its totals are the same.

    The layout is looked for at each call (a stat or two), not fixed when the reader is made:
    a follower may open the folder before its first file exists, and a re-run under the same id
    remakes the folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._segments = SegmentReader(folder)
        self._direct = DirectReader(folder)

    def layout(self) -> SegmentReader | DirectReader:
        """The reader of the layout on disk now: a folder without the direct layout's files
        is read as segments (an empty or missing folder reads as nothing, either way)."""
        return self._direct if self._direct.present() else self._segments

    def exists(self) -> bool:
        return self.folder.is_dir()

    def end(self, stream: int) -> int:
        """The offset just past the last byte on disk (0 when nothing is)."""
        return self.layout().end(stream)

    def totals(self, stream: int) -> StreamTotals:
        """The stream's totals as the files tell them, for a writer that can no longer say
        (killed): see each layout's ``totals``."""
        return self.layout().totals(stream)

    def read(self, stream: int, start: int, end: int | None = None) -> Iterator[Chunk]:
        """The stream's bytes from ``start`` up to ``end`` (default: what is on disk now);
        bytes no longer kept are skipped: the first chunk then begins past ``start``."""
        return self.layout().read(stream, start, end)

    def merged(self, since: tuple[int, int] = (0, 0)) -> Iterator[Chunk]:
        """Both streams from per-stream offsets ``since``, up to what is on disk now: in arrival
        order where the layout kept it (segments), else each stream in turn (direct)."""
        return self.layout().merged(since)


class SegmentReader:
    """``OutputWriter``'s layout: segment files per stream, and the ``order`` file that says
    how the streams interleaved."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def segments(self, stream: int) -> list[tuple[int, Path]]:
        """``(start offset, path)`` of the stream's segments on disk, oldest first."""
        prefix = STREAMS[stream] + "."
        found = []
        for path in self.folder.glob(prefix + "*"):
            try:
                found.append((int(path.name[len(prefix) :], 16), path))
            except ValueError:
                continue
        return sorted(found)

    def end(self, stream: int) -> int:
        """The offset just past the last byte on disk (0 when nothing is)."""
        return _end_of(self.segments(stream))

    def totals(self, stream: int) -> StreamTotals:
        """Written is where the kept bytes end, or where the order file last saw the stream
        when every segment was dropped; the tail is the last ``TAIL_BYTES`` on disk."""
        segments = self.segments(stream)
        if segments:  # the newest segment goes last: where it ends, the stream does
            written, first = _end_of(segments), segments[0][0]
        else:
            written = max((at for number, at in self.runs() if number == stream), default=0)
            first = written
        tail = bytearray()
        for chunk in self.read(stream, max(first, written - TAIL_BYTES)):
            tail += chunk.data
        return StreamTotals(written, written - first, first, tail[-TAIL_BYTES:])

    def read(self, stream: int, start: int, end: int | None = None) -> Iterator[Chunk]:
        """As ``OutputReader.read``, in chunks of at most one segment."""
        for first, path in self.segments(stream):
            if end is not None and first >= end:
                break
            skip = max(0, start - first)
            data = _read_from(path, skip)
            if not data:
                continue
            begin = first + skip
            if end is not None:
                data = data[: max(0, end - begin)]
            if data:
                yield Chunk(STREAMS[stream], begin, data)

    def runs(self) -> list[tuple[int, int]]:
        """``(stream, start offset)`` each time the writing stream changed, in arrival order."""
        try:
            raw = (self.folder / _ORDER).read_bytes()
        except FileNotFoundError:
            return []
        whole = len(raw) - len(raw) % _RUN.size
        return [_RUN.unpack_from(raw, at) for at in range(0, whole, _RUN.size)]

    def merged(self, since: tuple[int, int] = (0, 0)) -> Iterator[Chunk]:
        """Both streams in arrival order, as the ``order`` file recorded it."""
        ends = (self.end(0), self.end(1))  # before the runs: a run added since is cut at them
        runs = self.runs()
        stops = list(_run_stops(runs, ends))
        for (stream, start), stop in zip(runs, stops, strict=True):
            begin = max(start, since[stream])
            if stop > begin:
                yield from self.read(stream, begin, stop)


class DirectReader:
    """The direct layout (``adapters.direct_output``): one file per stream, written by the
    child itself, whose byte offsets are the stream's. The bound drops a prefix by punching a
    hole (the size and every offset stay); the kernel reads a hole as zeros, so every read goes
    through ``read_range``, which starts at the first byte kept and never returns zeros from
    the dropped prefix: a read from inside it begins where the kept bytes do, as a read from a
    deleted segment does in the other layout."""

    def __init__(self, folder: Path) -> None:
        self.paths = stream_paths(folder)

    def present(self) -> bool:
        """Whether the folder holds this layout: either file (they are opened one after the
        other, so a reader may see the first alone)."""
        return any(path.exists() for path in self.paths)

    def end(self, stream: int) -> int:
        """The file's size: where the stream ends, dropped prefix included."""
        try:
            return self.paths[stream].stat().st_size
        except FileNotFoundError:
            return 0

    def totals(self, stream: int) -> StreamTotals:
        """Written is the file's size, dropped the punched prefix, the tail the last
        ``TAIL_BYTES`` kept (``direct_output.stream_facts``); all 0 for a missing file."""
        facts = stream_facts(self.paths[stream])
        if facts is None:
            return StreamTotals()
        return StreamTotals(facts.written, facts.kept, facts.dropped, bytearray(facts.tail))

    def read(self, stream: int, start: int, end: int | None = None) -> Iterator[Chunk]:
        """As ``OutputReader.read``, in chunks of at most ``READ_MAX`` bytes (one file has no
        segments to cut at; this bounds what one chunk holds in memory)."""
        path = self.paths[stream]
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            size = os.fstat(fd).st_size
            stop = size if end is None else min(end, size)
            while start < stop:
                piece = read_range(fd, path, start, stop, READ_MAX)
                if not piece.data:
                    return
                yield Chunk(STREAMS[stream], piece.offset, piece.data)
                start = piece.offset + len(piece.data)
        finally:
            os.close(fd)

    def merged(self, since: tuple[int, int] = (0, 0)) -> Iterator[Chunk]:
        """Stdout's bytes past ``since[0]``, then stderr's past ``since[1]``, each up to where
        its file ended when the call began.

        The files keep no record of how the streams interleaved, and any interleaving made up
        here (by chunk, by line, by file times) would present a guess as the child's order.
        Each stream whole and exact, one after the other, is what is known. A follower that
        calls this again as bytes arrive sees the streams interleaved as finely as it polls:
        the order is as the reader saw it, which is all the layout can give."""
        ends = (self.end(0), self.end(1))
        for stream in (0, 1):
            yield from self.read(stream, since[stream], ends[stream])


def _end_of(segments: list[tuple[int, Path]]) -> int:
    """Where the last of ``segments`` ends (0 for none; its start if deleted meanwhile)."""
    if not segments:
        return 0
    start, path = segments[-1]
    try:
        return start + path.stat().st_size
    except FileNotFoundError:
        return start


def _run_stops(runs: list[tuple[int, int]], ends: tuple[int, int]) -> Iterator[int]:
    """Where each run ends: where the next run of its stream starts, else the stream's end."""
    following = list(ends)
    stops = []
    for stream, start in reversed(runs):
        stops.append(following[stream])
        following[stream] = start
    return reversed(stops)


def _read_from(path: Path, skip: int) -> bytes | None:
    try:
        with open(path, "rb") as file:
            file.seek(skip)
            return file.read()
    except FileNotFoundError:
        return None  # dropped by the writer since it was listed
