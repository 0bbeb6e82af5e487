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

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from procledger.adapters import output_reading as reading
from procledger.adapters.output_files import Chunk, OutputReader
from procledger.adapters.output_reading import FOLLOW_POLL_S, chunk_document
from procledger.application.outbox import store_key, this_host_id
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


def output_folder(
    registry: ProcessRegistry, record: ProcessRecord, root: Path | None = None
) -> Path | None:
    """Where ``record``'s output lives on this host, or ``None`` where no folder can be named
    (run without capture)."""
    key = store_key(registry.location) or f"memory:{id(registry)}"
    return reading.output_folder(record.model_dump(mode="json"), key, root)


def stored_tail(registry: ProcessRegistry, process_id: str) -> dict[str, bytes]:
    """The last bytes (up to 8 KiB) of each stream the ledger kept at the end of the run; empty
    while it runs, and for runs without capture or with a limit of 0.

    Raises:
        NotFound: no such process.
    """
    events = registry.events(process_id)
    return reading.tail_of([{"kind": e.kind, "payload": e.payload} for e in events])


def _reader(
    registry: ProcessRegistry, process_id: str, root: Path | None
) -> tuple[ProcessRecord, OutputReader]:
    """The record and a reader of its folder on this host; ``OutputUnavailable`` (with the
    stored tail) where there is none to read."""
    record = registry.get(process_id)
    reader = reading.reader_for(
        record.model_dump(mode="json"),
        store_key=store_key(registry.location) or f"memory:{id(registry)}",
        host_id=this_host_id(),
        tail=lambda: stored_tail(registry, record.id),
        root=root,
    )
    return record, reader


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
    reading.check_stream(stream)
    positions = reading.positions(since_offset)
    _, reader = _reader(registry, process_id, root)
    return reading.chunks(reader, stream, positions)


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
    reading.check_stream(stream)
    positions = reading.positions(since_offset)
    record, reader = _reader(registry, process_id, root)
    ended = lambda: registry.get(record.id).is_terminal  # noqa: E731
    return reading.follow(reader, stream, positions, ended, poll_s)
