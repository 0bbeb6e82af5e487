"""Actions with bodies that are not the action's fields, and what ``serve`` costs while idle
(docs/design.md §16.2): a 400 naming the field and nothing done; no CPU without changes, yet
a change still reaches the stream at once."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import httpx
import orjson
import pytest

from _shared import Processes, run_cli, wait_until

from .conftest import Server, background

JSON = {"content-type": "application/json"}
FORM = {"content-type": "application/x-www-form-urlencoded"}
BAD_STOPS: list[tuple[bytes, dict[str, str], str | None]] = [
    (b"garbage", {}, None),
    (b"garbage", FORM, None),
    (b"garbage", JSON, None),
    (b'{"mod": "kill"}', JSON, "mod"),
    (b'{"mod": "kill"}', FORM, "mod"),  # curl -d sends a JSON body as a form
    (b'{"mode": "kill", "extra": 1}', JSON, "extra"),
    (b"mode=kill&mod=x", FORM, "mod"),
    (b"mode=kill&mode=interrupt", FORM, None),
    (b"[]", JSON, None),
    (b'"kill"', JSON, None),
    (b"null", JSON, None),
    (b'{"mode": 5}', JSON, "mode"),
    (b'{"mode": null}', JSON, "mode"),
    (b'{"mode": "KILL"}', JSON, "mode"),
    (b'{"grace": "soon"}', JSON, "grace"),
    (b'{"grace": true}', JSON, "grace"),
    (b'{"grace": -1}', JSON, "grace"),
    (b'{"grace": 1e9}', JSON, "grace"),
    (b"grace=nan", FORM, "grace"),
    (b'{"mode": "kill", "pad": "' + b"x" * 20_000 + b'"}', JSON, None),
]


def kinds(ledger: str, process_id: str) -> list[str]:
    shown = run_cli("show", process_id, "--json", url=ledger)
    assert shown.returncode == 0, shown.stderr
    return [event["kind"] for event in orjson.loads(shown.stdout)["events"]]


def test_a_bad_action_body_is_a_400_naming_the_field_and_nothing_is_done(
    server: Server, ledger: str, procs: Processes
) -> None:
    sleeping = background(ledger, procs, "sleep", "600")
    stop, abandon = (f"/api/processes/{sleeping['id']}/{action}" for action in ("stop", "abandon"))
    with server.client() as client:
        for body, headers, field in BAD_STOPS:
            refused = client.post(stop, content=body, headers=headers)
            assert refused.status_code == 400, (body[:40], refused.text)
            said = refused.json()
            assert said["error"] == "BadAction", said
            assert said.get("field") == field, (body[:40], said)
            if field is not None:
                assert repr(field) in said["message"]
        for body, field in ((b'{"why": "x"}', "why"), (b'{"reason": 5}', "reason")):
            refused = client.post(abandon, content=body, headers=JSON)
            assert refused.status_code == 400, refused.text
            assert refused.json()["field"] == field
        for page in (f"/processes/{sleeping['id']}/stop", f"/processes/{sleeping['id']}/abandon"):
            refused = client.post(page, content=b"garbage=1", headers=FORM)  # the pages' forms
            assert refused.status_code == 400, (page, refused.text)
        assert "stop_requested" not in kinds(ledger, sleeping["id"])
        shown = client.get(f"/api/processes/{sleeping['id']}").json()["record"]
        assert shown["state"] == "running"
        asked = client.post(stop, content=b"", headers=JSON)  # empty: the documented default
        assert asked.status_code == 200, asked.text
    wait_until(
        lambda: kinds(ledger, sleeping["id"]).count("stop_requested") == 1,
        what="the one stop asked for to be recorded",
    )


@pytest.mark.parametrize(
    ("body", "headers"),
    [(b"{}", JSON), (b'{"mode": "kill", "grace": 0}', JSON), (b"mode=kill&grace=2.5", FORM)],
)
def test_a_good_body_is_carried_out(
    server: Server, ledger: str, procs: Processes, body: bytes, headers: Any
) -> None:
    sleeping = background(ledger, procs, "sleep", "600")
    with server.client() as client:
        asked = client.post(f"/api/processes/{sleeping['id']}/stop", content=body, headers=headers)
        assert asked.status_code == 200, asked.text
        assert asked.json()["result"] == "asked"
    wait_until(lambda: "stop_requested" in kinds(ledger, sleeping["id"]), what="the stop recorded")


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process, from /proc (clock ticks)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_serve_idle_costs_almost_nothing_yet_a_change_reaches_the_stream_at_once(
    server: Server, ledger: str
) -> None:
    assert server.proc is not None
    with server.client() as client:
        assert client.get("/api/feed").status_code == 200  # the hub is reading the feed
    before, started = cpu_seconds(server.proc.pid), time.monotonic()
    time.sleep(30)  # the measurement window, not a synchronisation
    share = (cpu_seconds(server.proc.pid) - before) / (time.monotonic() - started)
    assert share < 0.002, f"serve used {share:.3%} of a core while idle"
    seen: list[tuple[float, str]] = []
    reader = threading.Thread(target=read_stream, args=(server, seen), daemon=True)
    reader.start()
    wait_until(lambda: seen, what="the stream to open")
    ran = run_cli("run", "--", "true", url=ledger)
    assert ran.returncode == 0, ran.stderr
    committed = time.monotonic()
    found = wait_until(lambda: [at for at, text in seen if '"match":true' in text], timeout=10)
    assert found[0] - committed < 1.0, "a change took more than a second to reach the stream"


def read_stream(server: Server, seen: list[tuple[float, str]]) -> None:
    """Every chunk of the change stream, with when it came (the keep-alive comment first)."""
    with server.client() as client, client.stream("GET", "/stream/changes") as stream:
        try:
            for text in stream.iter_text():
                seen.append((time.monotonic(), text))
        except httpx.HTTPError:
            return  # the server was killed at teardown
