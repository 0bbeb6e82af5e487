"""Finding and reading a process's captured output from its record's JSON document
(docs/design.md §14): which folder on this host holds it, or why none does, and its chunks
from given offsets. Plain documents in, so the registry (``application.output``) and the CLI's
fast path (``logs`` without pydantic, §8.1) read output by the same rules.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from procledger.adapters.output_files import STREAMS, Chunk, OutputReader, folder_for, output_root
from procledger.domain.errors import OutputUnavailable

__all__ = [
    "FOLLOW_POLL_S",
    "check_stream",
    "chunk_document",
    "chunks",
    "follow",
    "positions",
    "reader_for",
    "tail_of",
]

Document = Mapping[str, Any]
FOLLOW_POLL_S: Final = 0.02
"""How often a follower looks for new bytes: the bound on its latency."""


def reader_for(
    record: Document,
    *,
    store_key: str,
    host_id: str | None,
    tail: Callable[[], dict[str, bytes]],
    root: Path | None = None,
) -> OutputReader:
    """A reader of ``record``'s output folder on this host (``host_id``); otherwise
    ``OutputUnavailable`` saying why, with the stored tail (``tail()``) where one was kept."""
    summary, process_id = record.get("output"), record["id"]
    if summary is None and record["input"].get("type") != "command":
        raise OutputUnavailable(_not_a_command(record))
    if summary is not None and not summary["capture"]:
        raise OutputUnavailable(f"process {process_id!r} was run without capture: no output kept")
    facts = record.get("os")
    host = summary["host_id"] if summary is not None else (facts["host_id"] if facts else None)
    if host is not None and host != host_id:
        folder = summary["folder"] if summary is not None else None
        where = folder or "its output folder"
        message = f"the output of process {process_id!r} is on host {host} ({where})"
        raise OutputUnavailable(message, tail())
    if summary is not None and summary["limit"] == 0:  # not even a tail was kept
        raise OutputUnavailable(f"process {process_id!r} ran with output limit 0: nothing kept")
    folder = output_folder(record, store_key, root)
    if folder is None or not folder.is_dir():
        raise OutputUnavailable(f"the output of process {process_id!r} is gone", tail())
    return OutputReader(folder)


def output_folder(record: Document, store_key: str, root: Path | None = None) -> Path | None:
    """Where ``record``'s output lives on this host, or ``None`` where no folder can be named
    (run without capture)."""
    summary = record.get("output")
    if summary is not None:
        return None if summary["folder"] is None else Path(summary["folder"])
    try:
        base = root if root is not None else output_root()
    except OSError:
        return None
    return folder_for(base, store_key, record["id"])


def tail_of(events: Sequence[Document]) -> dict[str, bytes]:
    """The last bytes (up to 8 KiB) of each stream the ledger kept at the end of the run, from
    the events' JSON: empty while it runs, and for runs without capture or with a limit of 0."""
    for event in reversed(events):
        if event["kind"] == "output_captured" and isinstance(event["payload"], dict):
            tails = event["payload"].get("tails") or {}
            return {name: base64.b64decode(tails.get(name, "")) for name in STREAMS}
    return {}


def _not_a_command(record: Document) -> str:
    """Why work that is no OS process of ours has no output: an engine runs as a Python call in
    its worker (no stdout or stderr of its own), external work never ran here at all."""
    process_id, given = record["id"], record["input"]
    if given.get("type") == "engine":
        return (
            f"process {process_id!r} is engine work (kind {given.get('kind')!r}), run as a "
            "Python call: it has no stdout or stderr of its own, so no output is captured"
        )
    return f"process {process_id!r} is external work that procledger never ran: no output is kept"


def positions(since_offset: int | tuple[int, int]) -> list[int]:
    """Per-stream start offsets: one int for both, or ``(stdout, stderr)``."""
    offsets = since_offset if isinstance(since_offset, tuple) else (since_offset, since_offset)
    for offset in offsets:
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"since_offset must be an int >= 0, not {since_offset!r}")
    return list(offsets)


def chunks(reader: OutputReader, stream: str | None, positions: list[int]) -> Iterator[Chunk]:
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


def check_stream(stream: str | None) -> None:
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


def follow(
    reader: OutputReader,
    stream: str | None,
    positions: list[int],
    ended: Callable[[], bool],
    poll_s: float = FOLLOW_POLL_S,
) -> Iterator[Chunk]:
    """What is on disk past ``positions``, then new output as it comes, until ``ended()`` (the
    process's record, asked 5 times a second) and everything it wrote has been yielded."""
    done, checked = False, 0.0
    while True:
        now = time.monotonic()
        if now - checked >= 0.2:  # the ledger is asked 5 times a second, the files every poll
            done, checked = ended(), now
        came = False
        for chunk in chunks(reader, stream, positions):
            came = True
            yield chunk
        if done and not came:
            return
        if not came:
            time.sleep(poll_s)  # a file has no wake-up to wait on; poll_s bounds the latency
