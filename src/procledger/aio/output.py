"""A process's captured output from an event loop (docs/design.md §17, §14).

The same reader as ``procledger.application.output.read_output``, called in a worker thread:
what is on disk past the positions read so far, then -- following -- new bytes every
``poll_s`` (a file has no wake-up to wait on) until the process has ended and everything it
wrote has been yielded. Cancelling the task that iterates ends the reading and nothing else.
Either layout of the output folder reads the same way (``OutputReader`` tells them apart).
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import TYPE_CHECKING, Final

import anyio
from anyio import CapacityLimiter, to_thread

from procledger.adapters.output_files import STREAMS, Chunk
from procledger.application.output import read_output
from procledger.domain.errors import OutputUnavailable

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = ["output_chunks"]

POLL_S: Final = 0.02
"""How often a follower looks for new bytes: the bound on its latency (as ``logs -f``)."""

ENDED_CHECK_S: Final = 0.2
"""How often a follower asks the ledger whether the process has ended."""


def _read_now(
    registry: ProcessRegistry,
    process_id: str,
    stream: str | None,
    positions: tuple[int, int],
    root: Path | None,
    *,
    check_ended: bool,
) -> tuple[list[Chunk], bool]:
    """Whether the process had ended (asked first, when ``check_ended``), then what is on
    disk past ``positions``: no chunk after an ended answer means nothing more will come."""
    ended = check_ended and registry.get(process_id).is_terminal
    try:
        chunks = read_output(registry, process_id, stream=stream, since_offset=positions, root=root)
    except OutputUnavailable:
        record = registry.get(process_id)
        if check_ended and not record.is_terminal and record.output is None:
            return [], False  # a capture folder is made with the first byte written
        raise
    return list(chunks), ended


async def output_chunks(
    registry: ProcessRegistry,
    process_id: str,
    *,
    follow: bool = True,
    stream: str | None = None,
    since_offset: int | tuple[int, int] = 0,
    root: Path | None = None,
    limiter: CapacityLimiter | None = None,
    poll_s: float = POLL_S,
) -> AsyncGenerator[Chunk, None]:
    """The output's chunks (both streams in arrival order -- stdout then stderr where a child
    wrote its own files, which keep no order between them -- or one ``stream``) from
    ``since_offset``; with ``follow``, then new ones until the process has ended.

    Raises:
        NotFound, OutputUnavailable, ValueError: as ``read_output``.
    """
    pair = since_offset if isinstance(since_offset, tuple) else (since_offset, since_offset)
    positions = list(pair)
    ended, checked = False, -ENDED_CHECK_S
    while True:
        check = follow and (
            not positions[0] + positions[1] or time.monotonic() - checked >= ENDED_CHECK_S
        )
        read = functools.partial(_read_now, check_ended=check)
        chunks, now_ended = await to_thread.run_sync(
            read, registry, process_id, stream, (positions[0], positions[1]), root, limiter=limiter
        )
        if check:
            ended, checked = now_ended, time.monotonic()
        for chunk in chunks:
            positions[STREAMS.index(chunk.stream)] = chunk.offset + len(chunk.data)
            yield chunk
        if not follow or (ended and not chunks):
            return
        if not chunks:
            await anyio.sleep(poll_s)
