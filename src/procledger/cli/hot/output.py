"""`logs`: a process's captured output, read from the files on this host (docs/design.md
§14, §8.1) -- or a whole service's, attempt after attempt (§15.4; ``showing.scoped`` says
which an id names)."""

from __future__ import annotations

import sys
import time
from argparse import Namespace
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, Final

from procledger.adapters import output_reading as reading
from procledger.adapters.output_files import Chunk, OutputReader
from procledger.adapters.output_reading import chunk_document
from procledger.application.document_reads import Document, LedgerReads
from procledger.cli.hot import marks as marking
from procledger.cli.hot.opening import reading as ledger
from procledger.cli.hot.showing import scoped
from procledger.cli.lines import EXIT_STOPPED, warn, write_json
from procledger.cli.values import UsageError
from procledger.domain.errors import NotFound, OutputUnavailable

__all__ = ["logs"]

LEDGER_POLL_S: Final = 0.2
"""How often `logs -f` of a service asks the ledger whether its next attempt has come (or the
service is over): as often as a follower asks whether its process has ended."""


def logs(options: Namespace, url: str | None, *, fast: bool) -> int:
    with ledger(url, fast=fast) as reads:
        record, whole = scoped(reads, options.process_id)
        if whole and options.since_offset:
            message = "an offset counts bytes of one attempt: name the attempt (ID.N)"
            raise UsageError(message, "--since-offset")
        if options.follow:
            marking.warn_if_unowned(reads, reads.newest_attempt(record["id"]) if whole else record)
        try:
            if whole:
                _ServiceLogs(reads, record, options).show(options.tail, options.follow)
            else:
                _show(reads, record, options)
        except KeyboardInterrupt:
            return EXIT_STOPPED
    return 0


def _show(reads: LedgerReads, record: Document, options: Namespace) -> None:
    stream, tail, since = options.stream, options.tail, options.since_offset
    tag = _tag(record)
    try:
        reader = reading.reader_for(
            record,
            store_key=reads.store_key,
            host_id=marking.host_id_or_none(),
            tail=lambda: reading.tail_of(reads.events(record["id"])),
        )
    except OutputUnavailable as gone:
        if not gone.tail:
            raise
        _print_stored_tail(gone.tail, stream, options.as_json, tag)
        warn(str(gone))
        return
    _say_dropped(record, stream, since)
    ends = [since, since]
    if options.follow and tail is None:
        chunks = _follow(reads, record, reader, stream, [since, since])
    else:
        chunks = reading.chunks(reader, stream, [since, since])
    tracked = _tracked(chunks, ends)
    _print(tracked if tail is None else _last_lines(tracked, tail), options.as_json, tag)
    if options.follow and tail is not None:
        _print(_follow(reads, record, reader, stream, ends), options.as_json, tag)


def _tag(record: Document) -> dict[str, Any] | None:
    """What `--json` adds to a service attempt's chunks: which attempt wrote them."""
    if record.get("attempt") is None:
        return None
    return {"id": record["id"], "attempt": record["attempt"]}


class _Part:
    """One attempt's output: a reader of its files here, or why there is none (with the tail
    the ledger kept, if any). A plain class: making a dataclass costs the fast path's start-up
    a millisecond (``cli/specs.py``)."""

    __slots__ = ("gone", "reader", "record")

    def __init__(
        self, record: Document, reader: OutputReader | None, gone: OutputUnavailable | None
    ) -> None:
        self.record, self.reader, self.gone = record, reader, gone


class _ServiceLogs:
    """A whole service's output: each attempt's files are its own, so they are read in turn,
    each after a header line (``==> attempt 2 (ID) <==``, as tail(1) heads each file); with
    ``--json`` each chunk names its attempt instead. Following moves on to each next attempt
    once it is spawned, until none can follow (``marks.restart_may_follow``)."""

    def __init__(self, reads: LedgerReads, first: Document, options: Namespace) -> None:
        self.reads, self.first_id = reads, str(first["id"])
        self.stream, self.as_json = options.stream, bool(options.as_json)
        self.headed: set[str] = set()  # the attempts whose header was written
        self.open_line = False  # the text printed so far ends inside a line
        self.warned: set[str] = set()

    def show(self, tail: int | None, follow: bool) -> None:
        """Everything, or the last ``tail`` lines of the whole service; then follow."""
        parts = [self._open(a) for a in self.reads.attempts(self.first_id) if _ran(a)]
        if parts and not any(p.reader is not None or (p.gone and p.gone.tail) for p in parts):
            assert parts[0].gone is not None
            raise parts[0].gone  # nothing of it is here: as for one process
        if tail is not None:
            newest, ends = self._print_tail(parts, tail)
            if follow:
                number = 1 if newest is None else int(newest.record["attempt"])
                self._follow_from(number, ends)
        elif follow:
            self._follow_from(1, [0, 0])
        else:
            for part in parts:
                self._header(part.record)
                self._print_part(part, [0, 0])

    def _open(self, record: Document) -> _Part:
        try:
            reader = reading.reader_for(
                record,
                store_key=self.reads.store_key,
                host_id=marking.host_id_or_none(),
                tail=lambda: reading.tail_of(self.reads.events(record["id"])),
            )
        except OutputUnavailable as gone:
            return _Part(record, None, gone)
        return _Part(record, reader, None)

    def _print_part(self, part: _Part, positions: list[int]) -> None:
        if part.reader is None:
            self._print_gone(part)
            return
        _say_dropped(part.record, self.stream, positions[0] + positions[1])
        self._emit(part.record, reading.chunks(part.reader, self.stream, positions))

    def _print_gone(self, part: _Part) -> None:
        """An attempt whose files are not here: the tail the ledger kept, and why."""
        assert part.gone is not None
        self._emit(part.record, self._stored(part), stored=True)
        warn(str(part.gone))

    def _stored(self, part: _Part) -> list[Chunk]:
        tail = part.gone.tail if part.gone is not None else {}
        return [
            Chunk(name, -1, data)
            for name, data in tail.items()
            if data and self.stream in (None, name)
        ]

    def _print_tail(self, parts: list[_Part], count: int) -> tuple[_Part | None, list[int]]:
        """The last ``count`` lines of the service, read newest attempt first (an attempt's
        unfinished last line counts as a line); the newest attempt that ran, and where each of
        its streams ended (a follower goes on from there)."""
        chosen: list[tuple[_Part, list[Chunk]]] = []
        ends, left = [0, 0], count
        for part in reversed(parts):
            positions = [0, 0]
            if part.reader is not None:
                source: Iterable[Chunk] = reading.chunks(part.reader, self.stream, positions)
            else:
                source = self._stored(part)
            lines = list(_last_lines(source, left))
            if not chosen:
                ends = positions
            chosen.append((part, lines))
            left -= _count_lines(lines)
            if left <= 0:
                break
        for part, lines in reversed(chosen):
            if lines:
                self._header(part.record)
                if part.reader is not None:
                    _say_dropped(part.record, self.stream, 0)
                self._emit(part.record, lines, stored=part.reader is None)
                if part.gone is not None:
                    warn(str(part.gone))
        return (parts[-1] if parts else None), ends

    def _follow_from(self, number: int, positions: list[int]) -> None:
        """Follow attempt ``number`` from ``positions``, then each later one as it is spawned,
        until the service is over: polled, never spun (``LEDGER_POLL_S``)."""
        while True:
            record = self._attempt(number)
            if record is None:
                if self._over(number - 1):
                    return
            elif _ran(record):
                self._follow_attempt(record, positions)
                number, positions = number + 1, [0, 0]
                continue
            elif marking.is_terminal(record):  # ended without running (stopped in its backoff)
                number, positions = number + 1, [0, 0]
                continue
            elif record["id"] not in self.warned:  # waits out its backoff, or its spawn
                self.warned.add(record["id"])
                marking.warn_if_unowned(self.reads, record)
            time.sleep(LEDGER_POLL_S)

    def _follow_attempt(self, record: Document, positions: list[int]) -> None:
        part = self._open(record)
        fresh = record["id"] not in self.headed
        self._header(record)
        if part.reader is None:
            if fresh:
                self._print_gone(part)
            return
        if fresh:
            _say_dropped(record, self.stream, positions[0] + positions[1])
        ended = lambda: marking.is_terminal(self.reads.record(record["id"]))  # noqa: E731
        self._emit(record, reading.follow(part.reader, self.stream, positions, ended))

    def _attempt(self, number: int) -> Document | None:
        """Attempt ``number`` as it stands now, or ``None`` while it is not registered."""
        if number == 1:
            return self.reads.record(self.first_id)
        try:
            record = self.reads.record(f"{self.first_id}.{number}")
        except NotFound:
            return None
        return record if record.get("attempt_of") == self.first_id else None

    def _over(self, number: int) -> bool:
        """Whether no attempt follows attempt ``number``, the newest: its policy, a stop, a
        ``crash_loop`` -- or its supervisor is gone, the only one that would start it."""
        newest = self._attempt(number)
        if newest is None:  # pruned meanwhile: nothing left to follow
            return True
        if not marking.is_terminal(newest):
            return False
        first = newest if number == 1 else self._attempt(1)
        if not marking.restart_may_follow(newest, first):
            return True
        name = newest.get("name")
        if marking.starter_gone(newest) and not (name and self.reads.wanted_up(name)):
            warn(
                f"the supervisor of service {self.first_id} is gone: no attempt will follow "
                f"attempt {number} (a supervisor's backoff schedule is not resumed)"
            )
            return True
        return False

    def _header(self, record: Document) -> None:
        """``==> attempt N (ID) <==`` before an attempt's output, after a blank line if
        another came before (as tail(1) separates files); none in JSON."""
        if record["id"] in self.headed:
            return
        first = not self.headed
        self.headed.add(record["id"])
        if self.as_json:
            return
        lead = b"" if first else b"\n\n" if self.open_line else b"\n"
        line = f"==> attempt {record['attempt']} ({record['id']}) <==\n"
        sys.stdout.buffer.write(lead + line.encode())
        sys.stdout.buffer.flush()
        self.open_line = False

    def _emit(self, record: Document, chunks: Iterable[Chunk], *, stored: bool = False) -> None:
        tag = {"tail": True} if stored else {}
        tag |= {"id": record["id"], "attempt": record["attempt"]}
        out = sys.stdout.buffer
        for chunk in chunks:
            if self.as_json:
                write_json(chunk_document(chunk.stream, chunk.offset, chunk.data) | tag)
            elif chunk.data:
                out.write(chunk.data)
                out.flush()
                self.open_line = not chunk.data.endswith(b"\n")


def _ran(record: Document) -> bool:
    """Whether an attempt was spawned (so it may have output): one stopped during its
    backoff never was, and one still in its backoff is not yet."""
    return record.get("os") is not None or record.get("output") is not None


def _count_lines(chunks: list[Chunk]) -> int:
    """How many lines ``chunks`` hold, an unfinished last one included."""
    lines = sum(chunk.data.count(b"\n") for chunk in chunks)
    return lines + (1 if chunks and not chunks[-1].data.endswith(b"\n") else 0)


def _follow(
    reads: LedgerReads,
    record: Document,
    reader: OutputReader,
    stream: str | None,
    positions: list[int],
) -> Iterator[Chunk]:
    ended = lambda: marking.is_terminal(reads.record(record["id"]))  # noqa: E731
    return reading.follow(reader, stream, positions, ended)


def _say_dropped(record: Document, stream: str | None, since: int) -> None:
    """Say on stderr when the head of a stream is not there to print: the output limit
    dropped it (docs/design.md §14), so the output shown does not begin at the start."""
    summary = record.get("output")
    if summary is None or since > 0:
        return
    for name in ("stdout", "stderr"):
        dropped = summary[name]["dropped"]
        if dropped and stream in (None, name):
            warn(
                f"the first {dropped} bytes of {name} of process {record['id']} were dropped "
                f"by its output limit of {summary['limit']} bytes (across both streams)"
            )


def _tracked(chunks: Iterable[Chunk], ends: list[int]) -> Iterator[Chunk]:
    """``chunks``, noting in ``ends`` where each stream's last one ended."""
    for chunk in chunks:
        ends[0 if chunk.stream == "stdout" else 1] = chunk.offset + len(chunk.data)
        yield chunk


def _print(chunks: Iterable[Chunk], as_json: bool, tag: dict[str, Any] | None = None) -> None:
    out = sys.stdout.buffer
    for chunk in chunks:
        if as_json:
            write_json(chunk_document(chunk.stream, chunk.offset, chunk.data) | (tag or {}))
        else:
            out.write(chunk.data)
            out.flush()


def _last_lines(chunks: Iterable[Chunk], count: int) -> Iterator[Chunk]:
    """The chunks that hold the last ``count`` lines (the first of them cut to its line)."""
    kept: deque[Chunk] = deque()
    lines = 0
    for chunk in chunks:
        kept.append(chunk)
        lines += chunk.data.count(b"\n")
        while kept and lines - kept[0].data.count(b"\n") > count:
            lines -= kept.popleft().data.count(b"\n")
    if count == 0:
        return
    yield from _cut_first(list(kept), lines, count, Chunk)


def _cut_first(kept: list[Chunk], lines: int, count: int, make: type[Chunk]) -> Iterator[Chunk]:
    """Drop the leading lines beyond ``count`` from the first chunk."""
    ends_open = bool(kept) and not kept[-1].data.endswith(b"\n")
    excess = lines - count + (1 if ends_open else 0)
    for index, chunk in enumerate(kept):
        if index == 0 and excess > 0:
            data, cut = chunk.data, 0
            for _ in range(excess):
                cut = data.index(b"\n", cut) + 1
            yield make(chunk.stream, chunk.offset + cut, data[cut:])
        else:
            yield chunk


def _print_stored_tail(
    tail: dict[str, bytes], stream: str | None, as_json: bool, tag: dict[str, Any] | None
) -> None:
    for name, data in tail.items():
        if data and stream in (None, name):
            if as_json:
                write_json({**chunk_document(name, -1, data), "tail": True} | (tag or {}))
            else:
                sys.stdout.buffer.write(data)
    sys.stdout.flush()
