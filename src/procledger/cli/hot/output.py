"""`logs`: a process's captured output, read from the files on this host (docs/design.md
§14, §8.1)."""

from __future__ import annotations

import sys
from argparse import Namespace
from collections import deque
from collections.abc import Iterable, Iterator

from procledger.adapters import output_reading as reading
from procledger.adapters.output_files import Chunk, OutputReader
from procledger.adapters.output_reading import chunk_document
from procledger.application.document_reads import Document, LedgerReads
from procledger.cli.hot import marks as marking
from procledger.cli.hot.opening import reading as ledger
from procledger.cli.hot.showing import resolve
from procledger.cli.lines import EXIT_STOPPED, warn, write_json
from procledger.domain.errors import OutputUnavailable

__all__ = ["logs"]


def logs(options: Namespace, url: str | None, *, fast: bool) -> int:
    with ledger(url, fast=fast) as reads:
        found = resolve(reads, options.process_id)
        record = reads.record(found)
        if options.follow:
            marking.warn_if_unowned(reads, record)
        try:
            _show(reads, record, options)
        except KeyboardInterrupt:
            return EXIT_STOPPED
    return 0


def _show(reads: LedgerReads, record: Document, options: Namespace) -> None:
    stream, tail, since = options.stream, options.tail, options.since_offset
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
        _print_stored_tail(gone.tail, stream, options.as_json)
        warn(str(gone))
        return
    _say_dropped(record, stream, since)
    ends = [since, since]
    if options.follow and tail is None:
        chunks = _follow(reads, record, reader, stream, [since, since])
    else:
        chunks = reading.chunks(reader, stream, [since, since])
    tracked = _tracked(chunks, ends)
    _print(tracked if tail is None else _last_lines(tracked, tail), options.as_json)
    if options.follow and tail is not None:
        _print(_follow(reads, record, reader, stream, ends), options.as_json)


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


def _print(chunks: Iterable[Chunk], as_json: bool) -> None:
    out = sys.stdout.buffer
    for chunk in chunks:
        if as_json:
            write_json(chunk_document(chunk.stream, chunk.offset, chunk.data))
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


def _print_stored_tail(tail: dict[str, bytes], stream: str | None, as_json: bool) -> None:
    for name, data in tail.items():
        if data and stream in (None, name):
            if as_json:
                write_json({**chunk_document(name, -1, data), "tail": True})
            else:
                sys.stdout.buffer.write(data)
    sys.stdout.flush()
