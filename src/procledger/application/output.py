"""Reading a process's captured output (docs/design.md §14): from an offset, following it until
the process ends, or the tail the ledger keeps.

The files are found the way the Supervisor wrote them: the record's ``output.folder`` once the
run has ended, else the folder named by the store and the process id under the output root.
The folder holds either layout (``OutputReader`` tells them apart): the Supervisor's segments,
or the two files an agent's child writes itself (docs/design.md §14.1). Reads never take a
lock: segments are append-only, and one the writer deletes meanwhile is skipped; a direct file
is append-only too, and its punched prefix is skipped the same way (those bytes were dropped
past the limit, and are never read back as the zeros of a hole). Merged, the segments give the
arrival order; the direct layout has none to give, so each stream comes in turn (stdout first)
and a follower interleaves them only as finely as it polls.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

from procledger.adapters.output_files import (
    STREAMS,
    Chunk,
    OutputReader,
    folder_for,
    output_root,
)
from procledger.application.outbox import store_key, this_host_id
from procledger.domain.errors import OutputUnavailable
from procledger.domain.records import ProcessRecord

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = [
    "Chunk",
    "chunk_document",
    "follow_output",
    "output_folder",
    "read_output",
    "stored_tail",
]

FOLLOW_POLL_S: Final = 0.02
"""How often ``follow_output`` looks for new bytes: the bound on its latency."""


def output_folder(
    registry: ProcessRegistry, record: ProcessRecord, root: Path | None = None
) -> Path | None:
    """Where ``record``'s output lives on this host, or ``None`` where no folder can be named
    (run without capture)."""
    summary = record.output
    if summary is not None:
        return None if summary.folder is None else Path(summary.folder)
    try:
        base = root if root is not None else output_root()
    except OSError:
        return None
    key = store_key(registry.location) or f"memory:{id(registry)}"
    return folder_for(base, key, record.id)


def stored_tail(registry: ProcessRegistry, process_id: str) -> dict[str, bytes]:
    """The last bytes (up to 8 KiB) of each stream the ledger kept at the end of the run; empty
    while it runs, and for runs without capture or with a limit of 0.

    Raises:
        NotFound: no such process.
    """
    for event in reversed(registry.events(process_id)):
        if event.kind == "output_captured" and isinstance(event.payload, dict):
            tails = event.payload.get("tails") or {}
            return {name: base64.b64decode(tails.get(name, "")) for name in STREAMS}
    return {}


def _reader(
    registry: ProcessRegistry, process_id: str, root: Path | None
) -> tuple[ProcessRecord, OutputReader]:
    """The record and a reader of its folder on this host; ``OutputUnavailable`` (with the
    stored tail) where there is none to read."""
    record = registry.get(process_id)
    summary = record.output
    if summary is None and record.input.type != "command":
        raise OutputUnavailable(_not_a_command(record))
    if summary is not None and not summary.capture:
        raise OutputUnavailable(f"process {record.id!r} was run without capture: no output kept")
    host = summary.host_id if summary is not None else (record.os.host_id if record.os else None)
    if host is not None and host != this_host_id():
        where = summary.folder if summary is not None and summary.folder else "its output folder"
        raise OutputUnavailable(
            f"the output of process {record.id!r} is on host {host} ({where})",
            stored_tail(registry, record.id),
        )
    if summary is not None and summary.limit == 0:  # not even a tail was kept
        raise OutputUnavailable(f"process {record.id!r} ran with output limit 0: nothing kept")
    folder = output_folder(registry, record, root)
    if folder is None or not folder.is_dir():
        raise OutputUnavailable(
            f"the output of process {record.id!r} is gone", stored_tail(registry, record.id)
        )
    return record, OutputReader(folder)


def _not_a_command(record: ProcessRecord) -> str:
    """Why work that is no OS process of ours has no output: an engine runs as a Python call in
    its worker (no stdout or stderr of its own), external work never ran here at all."""
    if record.input.type == "engine":
        return (
            f"process {record.id!r} is engine work (kind {record.input.kind!r}), run as a "
            "Python call: it has no stdout or stderr of its own, so no output is captured"
        )
    return f"process {record.id!r} is external work that procledger never ran: no output is kept"


def _positions(since_offset: int | tuple[int, int]) -> list[int]:
    """Per-stream start offsets: one int for both, or ``(stdout, stderr)``."""
    offsets = since_offset if isinstance(since_offset, tuple) else (since_offset, since_offset)
    for offset in offsets:
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"since_offset must be an int >= 0, not {since_offset!r}")
    return list(offsets)


def _chunks(reader: OutputReader, stream: str | None, positions: list[int]) -> Iterator[Chunk]:
    """What is on disk now past ``positions`` (advanced as chunks are yielded)."""
    if stream is None:
        source = reader.merged((positions[0], positions[1]))
    else:
        index = STREAMS.index(stream)
        source = reader.read(index, positions[index])
    for chunk in source:
        index = STREAMS.index(chunk.stream)
        positions[index] = chunk.offset + len(chunk.data)
        yield chunk


def read_output(
    registry: ProcessRegistry,
    process_id: str,
    *,
    stream: str | None = None,
    since_offset: int | tuple[int, int] = 0,
    root: Path | None = None,
) -> Iterator[Chunk]:
    """The process's output on disk now: both streams in arrival order (or one ``stream``),
    from byte ``since_offset`` of each stream (or ``(stdout, stderr)`` offsets); bytes
    dropped past the limit are skipped. Output a child wrote to files itself (the agent's
    layout) kept no arrival order: merged, its stdout comes first, then its stderr.

    Raises:
        NotFound: no such process.
        OutputUnavailable: run without capture, engine or external work (no output of its
            own), kept on another host (``.tail`` holds the stored tail), or deleted.
        ValueError: ``stream`` is not ``stdout``/``stderr``, or a negative offset.
    """
    _check_stream(stream)
    positions = _positions(since_offset)
    _, reader = _reader(registry, process_id, root)
    return _chunks(reader, stream, positions)


def follow_output(
    registry: ProcessRegistry,
    process_id: str,
    *,
    stream: str | None = None,
    since_offset: int | tuple[int, int] = 0,
    root: Path | None = None,
    poll_s: float = FOLLOW_POLL_S,
) -> Iterator[Chunk]:
    """As ``read_output``, then new output as it comes, until the process has ended and
    everything it wrote has been yielded. Errors as ``read_output``."""
    _check_stream(stream)
    positions = _positions(since_offset)
    record, reader = _reader(registry, process_id, root)
    return _follow(
        registry,
        process_id=record.id,
        reader=reader,
        stream=stream,
        positions=positions,
        poll_s=poll_s,
    )


def _follow(
    registry: ProcessRegistry,
    *,
    process_id: str,
    reader: OutputReader,
    stream: str | None,
    positions: list[int],
    poll_s: float,
) -> Iterator[Chunk]:
    ended, checked = False, 0.0
    while True:
        now = time.monotonic()
        if now - checked >= 0.2:  # the ledger is asked 5 times a second, the files every poll
            ended, checked = registry.get(process_id).is_terminal, now
        came = False
        for chunk in _chunks(reader, stream, positions):
            came = True
            yield chunk
        if ended and not came:
            return
        if not came:
            time.sleep(poll_s)  # a file has no wake-up to wait on; poll_s bounds the latency


def _check_stream(stream: str | None) -> None:
    if stream is not None and stream not in STREAMS:
        raise ValueError(f"stream must be 'stdout' or 'stderr', not {stream!r}")


def chunk_document(stream: str, offset: int, data: bytes) -> dict[str, object]:
    """A chunk as JSON-ready data, as ``procledger logs --json`` and the web view send it:
    ``{stream, offset, encoding, data}``, the bytes as UTF-8 text when they are, else base64."""
    try:
        return {"stream": stream, "offset": offset, "encoding": "utf-8", "data": data.decode()}
    except UnicodeDecodeError:
        encoded = base64.b64encode(data).decode()
        return {"stream": stream, "offset": offset, "encoding": "base64", "data": encoded}
