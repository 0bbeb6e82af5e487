"""The HTML pages -- the processes list and a process's page -- and the Stop and Abandon
actions (docs/design.md §16).

Pages are rendered by Jinja2 with autoescaping for every template, so argv, output, labels and
diagnostics are text wherever they appear; the live parts are filled in by ``static/app.js``
with ``textContent`` only. An action answers with a redirect to the process's page naming
what happened by a fixed word (``?said=stopped``), never by echoing text from the request.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import orjson
from anyio import to_thread
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.responses import HTMLResponse, RedirectResponse, Response

from procledger.domain.attempts import first_attempt_id, restart_may_follow
from procledger.domain.wording import (
    event_details,
    local_time,
    outcome,
    resources_line,
    service_lines,
)
from procledger.web.views import (
    STATUSES,
    StatusCounts,
    ledger_label,
    list_query,
    live_resources_line,
    row,
    scoped,
)

if TYPE_CHECKING:
    from starlette.requests import Request

    from procledger.domain.records import ProcessEvent, ProcessRecord

TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=select_autoescape(default=True, default_for_string=True),
    auto_reload=False,
)
LIVE_SAMPLE_TIMEOUT_S = 1.0
"""How long a process page waits for the agent's sample (it answers from memory at once)."""
OUTPUT_ATTEMPTS = 20
"""A service's page follows the output of at most its newest 20 attempts (the API and `logs`
give every one): a crash loop of thousands would otherwise open a stream for each."""
SAID = {
    "asked": "Stop requested: its supervisor carries it out.",
    "stopped": "Its supervisor was gone: the process was stopped here.",
    "abandoned": "Recorded as abandoned.",
    "ended": "It had already ended: nothing to do.",
    "nobody": "Nobody can stop it: no live supervisor and no live child on this host. "
    "If it is over, abandon it.",
    "owned": "Not abandoned: a live owner holds it or its child still runs. Stop it instead.",
}


def html(request: Request, template: str, code: int = 200, **values: Any) -> HTMLResponse:
    """A template rendered with what every page shows: the CSRF token and the ledger (short,
    with its whole URL as the header's title)."""
    whole = request.app.state.ledger_name
    location = request.app.state.registry.location
    short = ledger_label(
        location.masked, location.sqlite_path, default=location.default, home=_home()
    )
    page = TEMPLATES.get_template(template).render(
        csrf=request.state.csrf, ledger=short, ledger_url=whole, **values
    )
    return HTMLResponse(page, status_code=code)


def _home() -> str:
    return os.path.expanduser("~")


async def processes(request: Request) -> Response:
    """The processes list: ``ps``'s filters, newest first, a page at a time; the stream URL
    carries the feed position the page was read at, so the page misses no later change."""
    hub = request.app.state.hub
    await hub.ready.wait()
    query = list_query(request.query_params)
    head = hub.head  # before the read: a change in between comes again, re-applied by id
    stream = {"counts": "1", "cursor": head}
    scan = await to_thread.run_sync(query.page, request.app.state.registry)
    chosen = scan.records
    params = request.query_params
    next_url = None
    if len(chosen) == query.limit:
        # Before the last row's service, whose attempts (ids after its first's) are all read.
        before = first_attempt_id(chosen[-1])
        next_url = "/?" + urlencode({**query.params, "before": before})
    return html(
        request,
        "processes.html",
        rows=[row(record) for record in chosen],
        damaged=scan.damaged,
        statuses=STATUSES,
        status=params.get("status", "any"),
        state=params.get("state", ""),
        label=params.get("label", ""),
        since=params.get("since", ""),
        limit=query.limit,
        first_page=query.before is None,
        next_url=next_url,
        counts=count_links(hub.counts),
        stream_url="/stream/changes?" + urlencode({**query.params, **stream}),
    )


def count_links(counts: StatusCounts | None) -> list[dict[str, Any]]:
    """The counts above the list (docs/design.md §16.4), each linking to the list of its
    status; ``n`` is ``None`` while the counts are not known yet (the stream sends them)."""
    known = counts.counts() if counts is not None else {}
    return [
        {
            "status": status,
            "label": "all" if status == "any" else status,
            "n": known.get(status),
            "href": "/" if status == "any" else "/?" + urlencode({"status": status}),
        }
        for status in STATUSES
    ]


@dataclass(frozen=True)
class View:
    """What a process's page and ``GET /api/processes/ID`` show (as ``show``): of a service,
    its newest attempt and every attempt's events; of one attempt or any other process, its
    own. ``attempts``: every attempt of its service (empty for a process that is none)."""

    record: ProcessRecord
    attempts: list[ProcessRecord]
    events: list[ProcessEvent]
    whole: bool


def load_view(registry: Any, text: str) -> View:
    """The view of the process or service ``text`` names (``views.scoped``)."""
    found, whole = scoped(registry, text)
    record = registry.get(found)
    attempts = registry.attempts(found) if record.attempt is not None else []
    if whole:
        record = attempts[-1]
    shown = attempts if whole else [record]
    events = [event for each in shown for event in registry.events(each.id)]
    return View(record, attempts, events, whole)


async def process(request: Request) -> Response:
    """One process, or a whole service: its record (a service's newest attempt), attempts,
    event history and output (filled live; a service's page follows each new attempt)."""
    registry, hub = request.app.state.registry, request.app.state.hub
    await hub.ready.wait()
    head = hub.head  # before the read, as for the list
    view = await to_thread.run_sync(load_view, registry, request.path_params["pid"])
    record, first = view.record, (view.attempts[0] if view.attempts else None)
    sample = await to_thread.run_sync(live_sample, registry, record)
    numbers = {a.id: a.attempt for a in view.attempts} if view.whole else {}
    follows = {"service": first.id} if first is not None else {"process": record.id}
    return html(
        request,
        "process.html",
        record=record,
        row=row(record),
        summary=summary(record, view.attempts) + resources(record, sample),
        events=[event_row(e, numbers.get(e.process_id)) for e in view.events],
        whole=view.whole,
        attempts=attempts([e for e in view.events if e.process_id == record.id]),
        service=[service_row(each) for each in view.attempts],
        first=first,
        outputs=orjson.dumps(outputs(view)).decode(),
        over=over(view),
        said=SAID.get(request.query_params.get("said", "")),
        stream_url="/stream/changes?" + urlencode({**follows, "cursor": head}),
    )


def live_sample(registry: Any, record: ProcessRecord) -> dict[str, Any] | None:
    """The latest sample this host's agent holds of a running child's tree (its ``resources``
    op, as ``ps --resources`` asks it); ``None`` when it ended, has no child yet, or no agent
    answers: the page then shows nothing live rather than a guess."""
    if record.is_terminal or record.os is None:
        return None
    from procledger.agent.launch import resource_samples
    from procledger.application.outbox import store_key

    key = store_key(registry.location)
    return resource_samples(key, [record.id], timeout=LIVE_SAMPLE_TIMEOUT_S).get(record.id)


def resources(record: ProcessRecord, sample: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The resources row of the summary: what an ended run used (the record's, as ``show``
    says it), else the agent's live sample of a running one; none without either."""
    if record.resources is not None:
        return [("resources", resources_line(record.resources.model_dump(mode="json")))]
    if sample:
        return [("resources", "now: " + live_resources_line(sample))]
    return []


def over(view: View) -> bool:
    """Whether no attempt of the service follows its newest (``restart_may_follow``): the
    page's output pane then says it has shown all there is."""
    if not view.whole or not view.record.is_terminal:
        return False
    return not restart_may_follow(view.record, first=view.attempts[0])


def outputs(view: View) -> list[dict[str, Any]]:
    """The output streams the page follows in turn: each attempt's that ran, for a service
    (with its number, for the header the script writes before it); else the process's."""
    if not view.whole:
        return [{"url": f"/processes/{view.record.id}/output/stream", "attempt": None}]
    ran = [a for a in view.attempts if a.os is not None or a.output is not None]
    return [
        {"url": f"/processes/{a.id}/output/stream", "attempt": a.attempt, "id": a.id}
        for a in ran[-OUTPUT_ATTEMPTS:]
    ]


def summary(
    record: ProcessRecord, service: list[ProcessRecord] | None = None
) -> list[tuple[str, str]]:
    """The record as ``show`` summarises it: one ``name, value`` pair per thing that
    happened, with a service's name, attempt, policy, backoff, port and end (``service``:
    every attempt of its service)."""
    service = service or []
    rows = [("id", record.id)] + ([("name", record.name)] if record.name else [])
    rows += [
        ("state", f"{record.state.value} ({record.status.value})"),
        ("outcome", outcome(record)),
        ("disposition", record.disposition.value),
        ("created", local_time(record.created_at_ms)),
        ("updated", local_time(record.updated_at_ms)),
    ]
    if record.identity.label:
        rows.append(("label", record.identity.label))
    if record.os is not None:
        facts = record.os
        rows.append(("os pid", f"{facts.pid} (process group {facts.pgid}, host {facts.host_id})"))
    if record.stop_requested:
        rows.append(("stop requested", ", ".join(r.value for r in record.stop_requested)))
    if record.first_started is not None:
        rows.append(("first started by", record.first_started.owner.owner_id))
    if record.diagnostic:
        rows.append(("diagnostic", record.diagnostic))
    first = service[0].model_dump(mode="json") if service else None
    now_ms = int(time.time() * 1000)
    return rows + service_lines(record.model_dump(mode="json"), first, len(service), now_ms)


def event_row(event: ProcessEvent, attempt: int | None = None) -> dict[str, Any]:
    """An event as a row of the history: sequence, time, kind and its telling fields (and, in
    a whole service's history, its attempt)."""
    return {
        "attempt": attempt,
        "sequence": event.sequence,
        "at": local_time(event.occurred_at_ms),
        "kind": event.kind,
        "details": event_details(event, with_payload=True),
    }


def service_row(record: ProcessRecord) -> dict[str, Any]:
    """One attempt of a service (docs/design.md §15.4), as ``show`` lists it, linked to its
    own page (``ID.1`` for the first: its id alone names the whole service)."""
    return {
        "number": record.attempt,
        "id": record.id,
        "href": f"/processes/{record.id}" + (".1" if record.attempt == 1 else ""),
        "state": record.state.value,
        "outcome": outcome(record),
        "gave_up": record.gave_up or "",
    }


def attempts(events: list[ProcessEvent]) -> list[dict[str, Any]]:
    """Each time the process was set running (``started`` or ``backgrounded`` with its child's
    OS facts): a re-run after recovery is a second run of the same process."""
    owner = ""
    found: list[dict[str, Any]] = []
    for event in events:
        payload = event.payload if isinstance(event.payload, dict) else {}
        if event.kind == "first_started" and isinstance(payload.get("owner"), dict):
            owner = str(payload["owner"].get("owner_id", ""))
        if event.kind in ("started", "backgrounded"):
            facts = payload.get("os") if isinstance(payload.get("os"), dict) else {}
            found.append(
                {
                    "number": len(found) + 1,
                    "at": local_time(event.occurred_at_ms),
                    "owner": owner,
                    "pid": (facts or {}).get("pid", ""),
                }
            )
    return found


async def stop(request: Request) -> Response:
    """The Stop button: ask the live owner, or stop an orphaned tree here (the CLI's rules).
    Its body is checked as the API's is (§16.2): a 400, and nothing done, for a bad one."""
    from procledger.web.actions import StopBody
    from procledger.web.bodies import action_body

    body = await action_body(request, StopBody)
    actions = request.app.state.actions
    said = await to_thread.run_sync(actions.stop_said, request.path_params["pid"], body.mode.value)
    return _back(request.path_params["pid"], said)


async def abandon(request: Request) -> Response:
    """The Abandon button: record a process nobody owns as abandoned (the CLI's rules)."""
    from procledger.web.actions import AbandonBody
    from procledger.web.bodies import action_body

    body = await action_body(request, AbandonBody)
    actions = request.app.state.actions
    reason = body.reason or None
    said = await to_thread.run_sync(actions.abandon_said, request.path_params["pid"], reason)
    return _back(request.path_params["pid"], said)


def _back(process_id: str, said: str) -> RedirectResponse:
    return RedirectResponse(f"/processes/{process_id}?" + urlencode({"said": said}), 303)


async def timeline(request: Request) -> Response:
    """The timeline: a shell the script fills from ``/api/timeline`` and keeps live."""
    from procledger.web.timeline import DEFAULT_WINDOW, WINDOWS, window_ms

    chosen = request.query_params.get("window") or DEFAULT_WINDOW
    window_ms(chosen)  # a bad window is a 400 here, not an empty page
    api_url = "/api/timeline?" + urlencode({"window": chosen})
    return html(request, "timeline.html", windows=WINDOWS, window=chosen, api_url=api_url)
