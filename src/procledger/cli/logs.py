"""`logs`: a process's captured output (docs/design.md §14), and `prune`: retention."""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer

from procledger.cli._app import (
    EXIT_STOPPED,
    IdArgument,
    cli_state,
    count_option,
    open_ledger,
    resolve_id,
    warn,
    warn_if_unowned,
    write_json,
)
from procledger.cli._format import command_text, local_time, short_time, to_terminal, write_table
from procledger.cli.inspection import decode_filter, parse_age

if TYPE_CHECKING:
    from procledger import ProcessListFilter, ProcessRegistry
    from procledger.application.output import Chunk


class Stream(StrEnum):
    stdout = "stdout"
    stderr = "stderr"


def logs(
    ctx: typer.Context,
    process_id: IdArgument,
    *,
    stream: Annotated[
        Stream | None, typer.Option("--stream", help="Only this stream (default: both, merged).")
    ] = None,
    tail: Annotated[
        int | None,
        count_option("--tail", "N", "Only the last N lines."),
    ] = None,
    since_offset: Annotated[
        int,
        count_option("--since-offset", "K", "From byte K of each stream."),
    ] = 0,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Wait for new output until the process ends.")
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help='One object per chunk: {"stream", "offset", "encoding", "data"}.'
        ),
    ] = False,
) -> None:
    """Print a process's captured output: both streams in arrival order (stdout, then stderr,
    for a child that wrote its own files: they keep no order between the two).

    On another host, prints the tail the ledger kept and says where the rest is."""
    name = None if stream is None else stream.value
    with open_ledger(cli_state(ctx).url, create=False, read_only=True) as registry:
        found = resolve_id(registry, process_id)
        if follow:
            warn_if_unowned(registry, found)
        try:
            _show(
                registry,
                found,
                name,
                tail=tail,
                since_offset=since_offset,
                follow=follow,
                as_json=as_json,
            )
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_STOPPED) from None


def _show(
    registry: ProcessRegistry,
    found: str,
    name: str | None,
    *,
    tail: int | None,
    since_offset: int,
    follow: bool,
    as_json: bool,
) -> None:
    from procledger import OutputUnavailable
    from procledger.application.output import follow_output, read_output

    reading = follow_output if follow and tail is None else read_output
    try:
        chunks = reading(registry, found, stream=name, since_offset=since_offset)
    except OutputUnavailable as gone:
        if not gone.tail:
            raise
        _print_stored_tail(gone.tail, name, as_json)
        warn(str(gone))
        return
    ends = [since_offset, since_offset]
    tracked = _tracked(chunks, ends)
    _print(tracked if tail is None else _last_lines(tracked, tail), as_json)
    if follow and tail is not None:
        more = follow_output(registry, found, stream=name, since_offset=(ends[0], ends[1]))
        _print(more, as_json)


def _tracked(chunks: Iterable[Chunk], ends: list[int]) -> Iterator[Chunk]:
    """``chunks``, noting in ``ends`` where each stream's last one ended."""
    for chunk in chunks:
        ends[0 if chunk.stream == "stdout" else 1] = chunk.offset + len(chunk.data)
        yield chunk


def _print(chunks: Iterable[Chunk], as_json: bool) -> None:
    out = sys.stdout.buffer
    for chunk in chunks:
        if as_json:
            write_json(_chunk_json(chunk.stream, chunk.offset, chunk.data))
        else:
            out.write(chunk.data)
            out.flush()


def _chunk_json(stream: str, offset: int, data: bytes) -> dict[str, object]:
    from procledger.application.output import chunk_document

    return chunk_document(stream, offset, data)


def _last_lines(chunks: Iterable[Chunk], count: int) -> Iterator[Chunk]:
    """The chunks that hold the last ``count`` lines (the first of them cut to its line)."""
    from procledger.application.output import Chunk

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
                write_json({**_chunk_json(name, -1, data), "tail": True})
            else:
                sys.stdout.buffer.write(data)
    sys.stdout.flush()


def prune(
    ctx: typer.Context,
    *,
    older_than: Annotated[
        str,
        typer.Option("--older-than", metavar="DURATION", help="Ended before 90s/15m/2h/3d ago."),
    ],
    status: Annotated[
        str | None,
        typer.Option(
            "--status", metavar="STATUS", help="Only completed, failed, cancelled or abandoned."
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="List what would be deleted (id, state, updated, command); delete nothing.",
        ),
    ] = False,
) -> None:
    """Delete ended processes last updated long ago, with their events and output."""
    cutoff = int(time.time() * 1000) - parse_age(older_than, "--older-than")
    selection = decode_filter({"status": status or "any"})
    if dry_run:
        with open_ledger(cli_state(ctx).url, create=False, read_only=True) as registry:
            _preview_prune(registry, cutoff, selection)
        return
    with open_ledger(cli_state(ctx).url, create=False) as registry:
        report = registry.prune_terminal(cutoff, selection)
    sys.stdout.write(f"pruned {len(report.processes)} processes ({report.events} events)\n")


def _preview_prune(registry: ProcessRegistry, cutoff_ms: int, selection: ProcessListFilter) -> None:
    """`prune --dry-run`: the processes a prune with the same options would delete now, the
    longest unchanged first, in columns as `ps` writes them (into a pipe: tab-separated, times
    in full); on stderr, how many and that nothing was deleted. A damaged record is named, not
    listed (a prune deletes it if its row says it ended before the cutoff)."""
    from procledger.application.listing import select_processes
    from procledger.application.retention import prunable

    scan = select_processes(registry, selection, attempts=True)
    records = [record for record in scan.records if prunable(record, cutoff_ms)]
    records.sort(key=lambda record: (record.updated_at_ms, record.id))
    if records:
        when = short_time if to_terminal() else local_time
        rows = [(r.id, r.state.value, when(r.updated_at_ms), command_text(r)) for r in records]
        write_table(("ID", "STATE", "UPDATED", "COMMAND"), rows)
    if scan.damaged:
        warn(f"{len(scan.damaged)} damaged record(s) not listed: {', '.join(scan.damaged)}")
    warn(f"dry run: would prune {len(records)} processes; nothing was deleted")
