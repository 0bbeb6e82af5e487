"""Output capture beside the owner's output handling (docs/design.md §14).

A captured run's stdout and stderr are both piped; the owner thread that drains them (the pump
of ``execution.OwnedChild``) hands each chunk to the sinks made here, which append it to the
run's ``OutputWriter`` and pass it on live: to the caller's ``stdout`` consumer, or to this
process's own stdout and stderr descriptors where the child would have inherited them. No
thread of its own, and no call that can block on anything but the disk and the live terminal:
a capture that fails stops (its reason kept for the ledger) while the child runs on.
"""

from __future__ import annotations

import base64
import logging
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, NamedTuple

from procledger.adapters.output_files import (
    STREAMS,
    OutputReader,
    OutputWriter,
    StreamTotals,
    folder_for,
    output_root,
)
from procledger.application.outbox import store_key, this_host_id
from procledger.application.output import output_folder
from procledger.domain.records import OutputSummary, ProcessRecord, StreamOutput
from procledger.supervisor.execution import Borrower, Consumer, ReaderGone

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = [
    "DEFAULT_OUTPUT_LIMIT",
    "SALVAGED",
    "Capture",
    "SalvagedOutput",
    "capture_folder",
    "no_capture",
    "open_capture",
    "salvage",
]

log = logging.getLogger("procledger.supervisor")

DEFAULT_OUTPUT_LIMIT: Final = 64 * 1024 * 1024
"""Bytes kept per process across both streams unless the caller says otherwise."""


def open_capture(
    registry: ProcessRegistry,
    output_dir: Path | None,
    process_id: str,
    limit: int,
    live: Consumer | None,
    *,
    quiet: bool = False,
) -> Capture:
    """A run's capture, in the folder every reader of this store looks in (by store and
    process id; an in-memory store, which no other process can read, by this registry object)
    under ``output_dir`` (``<state dir>/output`` when None; either is created ``0700`` if it
    does not exist). A folder that cannot be made stops the capture at once, and the run goes
    on."""
    folder = capture_folder(registry, output_dir, process_id)
    return Capture(folder, limit, this_host_id(), live, quiet=quiet)


def capture_folder(
    registry: ProcessRegistry, output_dir: Path | None, process_id: str
) -> Path | None:
    """The folder a run's output goes in, as every reader of this store names it (by store
    and process id; an in-memory store by this registry object), ``output_dir`` created
    ``0700`` if need be; ``None`` when it cannot be made (logged: the run goes on)."""
    try:
        if output_dir is not None:
            output_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        root = output_dir if output_dir is not None else output_root()
        store = store_key(registry.location) or f"memory:{id(registry)}"
        return folder_for(root, store, process_id)
    except OSError as error:
        log.warning("process %r: output not captured: %s", process_id, error)
        return None


class _LiveFd:
    """Writes chunks to one of this process's descriptors until that fails once. When its
    reader went away (EPIPE: ``procledger run -- yes | head -1``), the child's pipe is closed
    too (``ReaderGone``), so the child meets the broken pipe it would have met writing there
    itself; any other failure (a terminal gone) stops only the live copy."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def __call__(self, chunk: bytes | memoryview) -> None:
        view, done = memoryview(chunk), 0
        while self._fd is not None and done < len(view):
            try:
                done += os.write(self._fd, view[done:])
            except OSError as error:
                log.info("live output to descriptor %s stopped: %s", self._fd, error)
                self._fd = None
                if isinstance(error, BrokenPipeError):
                    raise ReaderGone from error


class _Sink(Borrower):
    """One stream's sink: the chunk kept in the files, then passed on live (the caller's
    consumer gets bytes of its own; our descriptors take the borrowed view as it is)."""

    def __init__(
        self, writer: OutputWriter | None, stream: int, live: Consumer | _LiveFd | None
    ) -> None:
        self._writer = writer
        self._stream = stream
        self._live = live

    def __call__(self, chunk: bytes | memoryview) -> None:
        if self._writer is not None:
            self._writer.write(self._stream, chunk)
        live = self._live
        if isinstance(live, _LiveFd):
            live(chunk)
        elif live is not None:  # the caller's consumer may raise: that fails the run, as always
            live(chunk if isinstance(chunk, bytes) else bytes(chunk))


def _live_fd(fd: int) -> _LiveFd | None:
    """The live copy to one of our descriptors; None where it would go nowhere (``/dev/null``,
    as for a background run's detached supervisor): nothing is written there at all."""
    try:
        found, null = os.fstat(fd), os.stat(os.devnull)
    except OSError:
        return _LiveFd(fd)  # closed or odd: the first write says so, as it always did
    if stat.S_ISCHR(found.st_mode) and found.st_rdev == null.st_rdev:
        return None
    return _LiveFd(fd)


class Capture:
    """One run's capture: the two sinks for its pipes and, at the end, its summary."""

    def __init__(
        self,
        folder: Path | None,
        limit: int,
        host_id: str | None,
        live: Consumer | None,
        *,
        quiet: bool = False,
    ) -> None:
        """``folder`` None: the output folder could not be created (capture stopped at once);
        ``live``: the caller's stdout consumer, or None to pass both streams to ours;
        ``quiet``: pass neither stream on (only keep it), as for a recovery re-run."""
        self.host_id = host_id
        self.limit = limit
        self._writer = OutputWriter(folder, limit) if folder is not None else None
        self._stopped_early = None if folder is not None else "no output folder"
        self._live: tuple[Consumer | _LiveFd | None, Consumer | _LiveFd | None] = (
            (None, None) if quiet else (live if live is not None else _live_fd(1), _live_fd(2))
        )
        self._closed = False

    @property
    def folder(self) -> Path | None:
        return None if self._writer is None else self._writer.folder

    def sinks(self) -> tuple[Consumer, Consumer]:
        """The stdout and stderr consumers to give the child's pump (``Borrower``s)."""
        return (_Sink(self._writer, 0, self._live[0]), _Sink(self._writer, 1, self._live[1]))

    def finish(self) -> tuple[OutputSummary, dict[str, str]]:
        """Close the files; the summary and the base64 tails for the ledger."""
        writer = self._writer
        if writer is None:
            return OutputSummary(
                capture=True, host_id=self.host_id, limit=self.limit, stopped=self._stopped_early
            ), {}
        if not self._closed:
            writer.close()
            self._closed = True
        streams = [_stream_output(t) for t in writer.streams]
        summary = OutputSummary(
            capture=True,
            host_id=self.host_id,
            folder=str(writer.folder) if self.limit > 0 else None,
            limit=self.limit,
            stdout=streams[0],
            stderr=streams[1],
            stopped=writer.stopped,
        )
        return summary, _tails(writer.streams)


SALVAGED: Final = "its supervisor died: output written after that was not kept"


class SalvagedOutput(NamedTuple):
    """``output``/``tails`` as ``record_completed``, ``record_lost`` and ``record_abandoned``
    take them."""

    output: OutputSummary | None
    tails: dict[str, str] | None


def salvage(
    registry: ProcessRegistry, record: ProcessRecord, output_dir: Path | None = None
) -> SalvagedOutput:
    """The output facts of a run whose supervisor died before it could give them, read back
    from the files its capture left in this host's folder for it (written before the death,
    byte for byte: nothing is buffered); ``(None, None)`` when there are none here. Every
    terminal written for such a run (``restore``, a stop or an abandon of an orphan) passes them
    on. The limit the run was given is not in the ledger: the summary says it is unknown."""
    folder = output_folder(registry, record, output_dir)
    reader = None if folder is None else OutputReader(folder)
    if reader is None or not reader.exists():
        return SalvagedOutput(None, None)
    totals = [reader.totals(stream) for stream in (0, 1)]
    summary = OutputSummary(
        capture=True,
        host_id=this_host_id(),
        folder=str(folder),
        limit=None,
        stdout=_stream_output(totals[0]),
        stderr=_stream_output(totals[1]),
        stopped=SALVAGED,
    )
    return SalvagedOutput(summary, _tails(totals))


def _stream_output(totals: StreamTotals) -> StreamOutput:
    return StreamOutput(written=totals.written, kept=totals.kept, dropped=totals.dropped)


def _tails(totals: Sequence[StreamTotals]) -> dict[str, str]:
    """The base64 tails the ledger keeps (``TAIL_BYTES`` of each stream at most)."""
    return {
        name: base64.b64encode(bytes(t.tail)).decode()
        for name, t in zip(STREAMS, totals, strict=True)
    }


def no_capture(host_id: str | None) -> tuple[OutputSummary, dict[str, str]]:
    """The summary of a run made without capture."""
    return OutputSummary(capture=False, host_id=host_id), {}
