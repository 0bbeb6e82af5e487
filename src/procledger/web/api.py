"""The JSON API under ``/api/``, in the shapes the CLI prints with ``--json`` (docs/design.md
§8, §16): a script that reads ``procledger ps --json`` reads ``/api/processes`` alike.

- ``GET /api/processes``: ``{"records", "damaged"}`` (``ps --json``), with the list filters
  of the page (``status``, ``state``, ``label``, ``since``) and ``limit``: the newest N.
- ``GET /api/processes/{id}``: ``{"record", "events"}`` (``show --json``; a service's:
  its newest attempt, every attempt's events, and ``"attempts"``).
- ``GET /api/processes/{id}/output``: ``[{stream, offset, encoding, data}]`` (``logs --json``),
  from ``since_offset``, one ``stream`` or both; a service's: every attempt's in turn, each
  chunk with its ``id`` and ``attempt``.
- ``GET /api/feed?since=N&limit=N``: ``[{"record", "cursor"}]`` (``feed --json``).
- ``GET /api/timeline?window=1h``: ``{"now_ms", "window_ms", "cursor", "truncated", "spans"}``,
  each attempt of the window as a span (``web/timeline.py``); ``?ids=A,B``: those processes'.
- ``POST /api/processes/{id}/stop`` (``mode``, ``grace``) and ``.../abandon`` (``reason``):
  ``{"record", "result"}``; a refusal is 409 with ``{"error", "message"}``. The body is
  empty (the defaults: ``interrupt``, 10 s), a JSON object or a form of exactly those fields;
  anything else is a 400 ``{"error", "message", "field"}`` and nothing is done.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from anyio import to_thread
from starlette.responses import JSONResponse, Response

from procledger.web.bodies import action_body
from procledger.web.pages import load_view
from procledger.web.views import list_query, scoped

if TYPE_CHECKING:
    from starlette.requests import Request


FEED_LIMIT = 500


def dump(model: Any) -> Any:
    """A model as the CLI's ``--json`` writes it."""
    return model.model_dump(mode="json")


async def processes(request: Request) -> Response:
    """``ps --json``: every matching record, or with ``limit`` the newest N (oldest first)."""
    query = list_query(request.query_params)
    limit = query.limit if request.query_params.get("limit") else None
    scan = await to_thread.run_sync(query.listing, request.app.state.registry, limit)
    records, damaged = scan.records, scan.damaged
    return JSONResponse({"records": [dump(r) for r in records], "damaged": damaged})


async def process(request: Request) -> Response:
    """``show --json``: the record and its whole history; an id prefix or a service's name
    works, as in the CLI."""
    registry = request.app.state.registry
    view = await to_thread.run_sync(load_view, registry, request.path_params["pid"])
    document = {"record": dump(view.record), "events": [dump(e) for e in view.events]}
    if view.attempts:
        document["attempts"] = [dump(a) for a in view.attempts]
    return JSONResponse(document)


async def output(request: Request) -> Response:
    """The output on disk now as ``logs --json`` chunks (a list: a response has one body)."""
    registry = request.app.state.registry
    stream = request.query_params.get("stream") or None
    since = _whole(request, "since_offset", 0)
    chunks = await to_thread.run_sync(
        read_chunks, registry, request.path_params["pid"], stream, since
    )
    return JSONResponse(chunks)


def read_chunks(registry: Any, text: str, stream: str | None, since: int) -> list[Any]:
    """``logs --json`` of what ``text`` names: a service's every attempt in turn (each chunk
    naming its attempt; an offset counts one attempt's bytes, so none is taken), else one
    process's (a service's attempt's chunks name it too)."""
    from procledger.application.output import chunk_document, read_output

    found, whole = scoped(registry, text)
    if whole and since:
        raise ValueError("since_offset counts bytes of one attempt: name the attempt (ID.N)")
    record = registry.get(found)
    shown = registry.attempts(found) if whole else [record]
    if whole:
        shown = [a for a in shown if a.os is not None or a.output is not None] or shown[:1]
    found_chunks: list[Any] = []
    for each in shown:
        tag = {} if each.attempt is None else {"id": each.id, "attempt": each.attempt}
        chunks = read_output(registry, each.id, stream=stream, since_offset=since)
        found_chunks += [chunk_document(c.stream, c.offset, c.data) | tag for c in chunks]
    return found_chunks


async def feed(request: Request) -> Response:
    """``feed --json`` lines as a list: at most 500 changes after ``since``; page with the
    last cursor."""
    since = _whole(request, "since", 0)
    limit = min(_whole(request, "limit", FEED_LIMIT), FEED_LIMIT)
    registry = request.app.state.registry
    records, _ = await to_thread.run_sync(registry.changes_since, since, limit)
    return JSONResponse([{"record": dump(r), "cursor": r.change_seq} for r in records])


def _whole(request: Request, name: str, default: int) -> int:
    """A query parameter that counts (a cursor, an offset, a limit): a bare ``400`` naming it
    when it is not a whole number of at least 0.

    Raises:
        ValueError: it is not.
    """
    text = request.query_params.get(name) or ""
    if not text:
        return default
    if not text.isascii() or not text.isdigit():
        raise ValueError(f"{name} must be a whole number of at least 0, not {text!r}")
    return int(text)


async def stop(request: Request) -> Response:
    """Stop by the CLI's rules; 409 ``NobodyToStop`` when nobody can carry it out; 400, and
    nothing done, for a body that is not exactly the action's fields."""
    from procledger.web.actions import StopBody

    body = await action_body(request, StopBody)
    actions = request.app.state.actions
    pid = request.path_params["pid"]
    record, result = await to_thread.run_sync(actions.stop, pid, body.mode.value, body.grace)
    return JSONResponse({"record": dump(record), "result": result})


async def abandon(request: Request) -> Response:
    """Abandon by the CLI's rules; 409 ``StillOwned`` while someone holds the process; 400,
    and nothing done, for a body that is not exactly the action's fields."""
    from procledger.web.actions import AbandonBody

    body = await action_body(request, AbandonBody)
    actions = request.app.state.actions
    record, result = await to_thread.run_sync(
        actions.abandon, request.path_params["pid"], body.reason or None
    )
    return JSONResponse({"record": dump(record), "result": result})


async def timeline(request: Request) -> Response:
    """The timeline's spans: of the window ending now, with the feed position read before them
    (the page follows the changes after it), or of the processes ``ids`` names."""
    import time

    from procledger.web.timeline import read_ids, read_window, window_ms

    registry, hub = request.app.state.registry, request.app.state.hub
    now_ms = int(time.time() * 1000)
    ids = request.query_params.get("ids")
    if ids is not None:
        wanted = [part for part in ids.split(",") if part]
        return JSONResponse(await to_thread.run_sync(read_ids, registry, wanted, now_ms))
    window = window_ms(request.query_params.get("window"))
    await hub.ready.wait()
    head = hub.head  # before the read: a change in between comes again, re-applied by id
    found = await to_thread.run_sync(read_window, registry, window, now_ms, head)
    return JSONResponse(found)
