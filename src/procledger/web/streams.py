"""The live parts of the web view as Server-Sent Events (docs/design.md §16).

``/stream/changes``: the change feed from a cursor -- the ``Last-Event-ID`` a reconnecting
browser sends, else the ``cursor`` the page was rendered at -- each event's id being the
change's position, so a reconnect resumes exactly after the last change the page applied.
With list filters, a change that leaves the list says so (``match: false``); with
``process=ID``, only that process's changes are sent; with ``service=ID`` (a service's first
id), those of every attempt of that service, so its page sees each new attempt come. With
``counts=1`` (the processes list's), a ``counts`` event -- every status's count over the
whole ledger -- when the stream opens and after each batch that changed them.

``/processes/{id}/output/stream``: the captured output from the offsets in ``Last-Event-ID``
(``stdout,stderr``), chunk by chunk in arrival order, until the process has ended and all of
it was sent; then an ``end`` event, on which the page closes the stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING

import orjson
from anyio import to_thread
from starlette.responses import StreamingResponse

from procledger.domain.attempts import first_attempt_id
from procledger.web.views import counts_json, list_query

if TYPE_CHECKING:
    from starlette.requests import Request

    from procledger.application.registry import ProcessRegistry
    from procledger.web.hub import Change, FeedHub

OUTPUT_POLL_S = 0.05
"""How often an output stream looks for new bytes: the bound on a line's delay."""
OUTPUT_BATCH = 256 * 1024
"""At most this many bytes per read of the output files: a huge backlog streams in parts."""
RETRY = "retry: 500\n\n"
"""The browser reconnects half a second after losing a stream (a server restart)."""
SSE_HEADERS = {"cache-control": "no-store", "x-accel-buffering": "no"}


def event(kind: str, data: str, event_id: str | None = None) -> str:
    """One SSE event; ``data`` is JSON, which has no raw newline."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {kind}\ndata: {data}\n\n"


def cursor_of(request: Request, head: int) -> int:
    """Where a stream starts: ``Last-Event-ID`` (a reconnect), else ``?cursor=``, else now."""
    for text in (request.headers.get("last-event-id"), request.query_params.get("cursor")):
        if text and text.strip().isdigit():
            return int(text)
    return head


def changes(request: Request) -> StreamingResponse:
    """The change feed as SSE, filtered for a list or one process."""
    hub = request.app.state.hub
    query = list_query(request.query_params)
    only = request.query_params.get("process")
    service = request.query_params.get("service")
    cursor = cursor_of(request, hub.head)

    def render(batch: Iterable[Change]) -> str:
        out = []
        for change in batch:
            if only is not None and change.record.id != only:
                continue
            if service is not None and first_attempt_id(change.record) != service:
                continue
            if only is not None or service is not None or query.matches(change.record):
                data = '{"match":true,"row":' + change.row + "}"
            else:
                data = orjson.dumps({"match": False, "id": change.record.id}).decode()
            out.append(event("row", data, str(change.seq)))
        return "".join(out)

    counts = _counts_sender(hub) if request.query_params.get("counts") == "1" else lambda: ""

    async def body() -> AsyncIterator[str]:
        yield RETRY + counts()
        async for batch in hub.follow(cursor):
            yield (render(batch) + counts()) or ": keep-alive\n\n"

    return StreamingResponse(body(), media_type="text/event-stream", headers=SSE_HEADERS)


def _counts_sender(hub: FeedHub) -> Callable[[], str]:
    """A ``counts`` event when the hub's counts are known and differ from those this stream
    last sent (no id: ``Last-Event-ID`` stays the last change's), else nothing."""
    sent = -1

    def counts() -> str:
        nonlocal sent
        known = hub.counts
        if known is None or known.version == sent:
            return ""
        sent = known.version
        return event("counts", counts_json(known))

    return counts


def output(request: Request, process_id: str) -> StreamingResponse:
    """A process's output as SSE, following it until the process ends."""
    registry: ProcessRegistry = request.app.state.registry
    positions = _offsets(request.headers.get("last-event-id"))

    async def body() -> AsyncIterator[str]:
        yield RETRY
        while True:
            chunks, done = await to_thread.run_sync(read_some, registry, process_id, positions)
            if chunks:
                yield "".join(chunks)
            if done:
                yield event("end", "{}")
                return
            if not chunks:
                await asyncio.sleep(OUTPUT_POLL_S)

    return StreamingResponse(body(), media_type="text/event-stream", headers=SSE_HEADERS)


def _offsets(text: str | None) -> list[int]:
    parts = (text or "").split(",")
    if len(parts) == 2 and all(part.strip().isdigit() for part in parts):
        return [int(parts[0]), int(parts[1])]
    return [0, 0]


def read_some(
    registry: ProcessRegistry, process_id: str, positions: list[int]
) -> tuple[list[str], bool]:
    """The events for the output past ``positions`` (advanced), and whether the stream is
    done: the process had ended before this read and nothing more came, or there is no output
    to read here (an ``unavailable`` event with the stored tail). A process not started yet
    has no files: the stream waits for them."""
    from procledger.application.output import read_output
    from procledger.domain.errors import OutputUnavailable

    record = registry.get(process_id)
    ended = record.is_terminal  # read before the files: nothing is written after it ended
    try:
        out, size = [], 0
        for chunk in read_output(registry, process_id, since_offset=(positions[0], positions[1])):
            index = 0 if chunk.stream == "stdout" else 1
            positions[index] = chunk.offset + len(chunk.data)
            out.append(
                event(
                    "chunk",
                    chunk_json(chunk.stream, chunk.offset, chunk.data),
                    f"{positions[0]},{positions[1]}",
                )
            )
            size += len(chunk.data)
            if size >= OUTPUT_BATCH:
                return out, False
    except OutputUnavailable as gone:
        if not ended and record.os is None:  # not started yet: its files come with the child
            return [], False
        tail = {name: data.decode(errors="replace") for name, data in gone.tail.items()}
        return [
            event("unavailable", orjson.dumps({"message": str(gone), "tail": tail}).decode())
        ], True
    return out, ended and not out


def chunk_json(stream: str, offset: int, data: bytes) -> str:
    """A chunk as ``procledger logs --json`` prints it: UTF-8 text, else base64."""
    from procledger.application.output import chunk_document

    return orjson.dumps(chunk_document(stream, offset, data)).decode()
