"""The web view of a named service (issue 30, docs/design.md §19.6): one row per service
with its name, its backoff and whether it gave up; a service's page with its newest attempt,
its history and every attempt's output; the API in the CLI's ``--json`` shapes.

Services are started by a real Supervisor in this test process, on the served ledger, and shut
down at the end; their children are killed by exact pid at teardown (``procs``). Waits are
bounded polls or Playwright's own; nothing sleeps to synchronise.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import orjson

from _services import CRASH_LOOP, LONG_BACKOFF, Services
from _shared import run_cli, wait_until

from .conftest import Server


def cli_json(*args: str, url: str) -> Any:
    ran = run_cli(*args, "--json", url=url)
    assert ran.returncode == 0, ran.stderr
    return orjson.loads(ran.stdout)


def cli_lines(*args: str, url: str) -> list[Any]:
    ran = run_cli(*args, "--json", url=url)
    assert ran.returncode == 0, ran.stderr
    return [orjson.loads(line) for line in ran.stdout.splitlines()]


def test_the_api_shows_a_service_as_show_and_logs_do(
    server: Server, ledger: str, services: Services
) -> None:
    first, second, _ = services.crash_loop()
    with server.client() as client:
        for text in ("svc", first.id, second.id, f"{first.id}.1"):
            assert client.get(f"/api/processes/{text}").json() == cli_json("show", text, url=ledger)
            answer = client.get(f"/api/processes/{text}/output").json()
            assert answer == cli_lines("logs", text, url=ledger), text
        listed = client.get("/api/processes", params={"status": "any"}).json()
        assert listed == cli_json("ps", "--all", url=ledger)
        refused = client.get("/api/processes/svc/output", params={"since_offset": "2"})
        assert refused.status_code == 400
        assert "name the attempt" in refused.json()["message"]


def test_the_list_shows_a_service_as_one_named_row(
    server: Server, ledger: str, services: Services
) -> None:
    first, _, third = services.crash_loop()
    with server.client() as client:
        page = client.get("/").text
    assert page.count(f'data-service="{first.id}"') == 1
    row = page.split(f'data-service="{first.id}"')[1].split("</tr>")[0]
    assert f'data-id="{third.id}"' in row
    assert f'<a href="/processes/{first.id}">{third.id}</a>' in row  # the whole service
    assert '<td class="name">svc</td>' in row
    assert '<td class="state">exited</td>' in row
    assert html.escape("exit 1 · attempt 3, gave up (crash_loop)") in row


def test_a_service_in_its_backoff_says_when_it_starts_again(
    server: Server, ledger: str, services: Services
) -> None:
    handle = services.start("exit 1", "slow", LONG_BACKOFF)
    pending = wait_until(
        lambda: services.attempt(handle.process_id, 2), 30, "attempt 2 to be registered"
    )
    assert pending.starts_at_ms is not None
    with server.client() as client:
        page = client.get("/").text
        service = client.get("/processes/slow").text
    row = page.split(f'data-service="{handle.process_id}"')[1].split("</tr>")[0]
    assert f'data-starts-at="{pending.starts_at_ms}"' in row
    assert '<td class="state">backoff</td>' in row
    assert re.search(r'<td class="outcome">next in (2\d|3[0-3])s · attempt 2</td>', row), row
    found = re.search(r'<dd data-field="backoff" data-until="(\d+)">([^<]*)</dd>', service)
    assert found, service
    assert int(found[1]) == pending.starts_at_ms
    assert re.fullmatch(r"next attempt at \S+ \(in (2\d|3[0-3])s\)", found[2]), found[2]
    assert '<dd data-field="name">slow</dd>' in service
    assert '<dd data-field="attempt">2 of 2</dd>' in service


def test_a_service_page_is_its_newest_attempt_with_its_history(
    server: Server, ledger: str, services: Services
) -> None:
    first, second, third = services.crash_loop()
    with server.client() as client:
        page = client.get("/processes/svc").text
        alone = client.get(f"/processes/{second.id}").text
    assert f'data-id="{third.id}"' in page
    for field, value in (("name", "svc"), ("attempt", "3 of 3"), ("gave up", "crash_loop")):
        assert f'<dd data-field="{field}">{value}</dd>' in page, field
    for href in (f"{first.id}.1", second.id, third.id):
        assert f'href="/processes/{href}"' in page
    assert f'<a href="/processes/{first.id}">svc</a>' in page  # the service's own page
    assert "<th>attempt</th><th>seq</th>" in page  # every attempt's events
    outputs = orjson.loads(html.unescape(page.split('data-outputs="')[1].split('"')[0]))
    assert [(o["attempt"], o["id"]) for o in outputs] == [
        (a.attempt, a.id) for a in (first, second, third)
    ]
    assert f'data-id="{second.id}"' in alone
    assert '<dd data-field="attempt">2 of 3</dd>' in alone
    assert "<th>attempt</th><th>seq</th>" not in alone


# -- in a browser ----------------------------------------------------------------------------


def test_a_backoff_counts_down_in_the_list(page: Any, ledger: str, services: Services) -> None:
    from playwright.sync_api import expect

    handle = services.start("exit 1", "slow", LONG_BACKOFF)
    row = page.locator(f'tr[data-service="{handle.process_id}"]')
    expect(row.locator("td.state")).to_have_text("backoff", timeout=10_000)  # live, no reload
    expect(row.locator("td.name")).to_have_text("slow")
    outcome = row.locator("td.outcome")
    expect(outcome).to_have_text(re.compile(r"^next in (2\d|3[0-3])s · attempt 2$"))
    before = outcome.text_content()
    expect(outcome).not_to_have_text(before or "", timeout=5_000)  # it counts down


def test_a_service_page_follows_every_attempt_live(
    page: Any, server: Server, ledger: str, services: Services, tmp_path: Path
) -> None:
    """Opened while attempt 1 waits for a gate: once the gate opens, the page shows each
    next attempt's output under its header, and the record turns to the last attempt, given
    up -- without a reload."""
    from playwright.sync_api import expect

    gate = tmp_path / "gate"
    script = f'echo "attempt $$"; while [ ! -e "{gate}" ]; do sleep 0.05; done; exit 1'
    handle = services.start(script, "svc", CRASH_LOOP)
    page.goto(f"{server.base}/processes/svc")
    output = page.locator("#output")
    expect(output).to_contain_text("attempt ")
    gate.touch()
    expect(page.locator('#record dd[data-field="gave up"]')).to_have_text(
        "crash_loop", timeout=30_000
    )
    expect(page.locator('#record dd[data-field="attempt"]')).to_have_text("3 of 3")
    attempts = services.registry.attempts(handle.process_id)
    whole = "\n".join(
        f"==> attempt {a.attempt} ({a.id}) <==\nattempt {a.os.pid}\n"
        for a in attempts
        if a.os is not None
    )
    expect(output).to_have_text(whole, timeout=10_000)
    expect(page.locator("#output-note")).to_have_text(
        "the service is over; this is all of its output"
    )
    expect(page.locator("#service-attempts tbody tr")).to_have_count(3)
