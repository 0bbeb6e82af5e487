"""The web view in a real browser (docs/design.md §16): headless Chromium, driven by Playwright,
against ``procledger serve`` and children started through the CLI. Waits are Playwright's own,
each bounded; nothing sleeps to synchronise.

``PROCLEDGER_WRITE_SCREENSHOT=1`` also writes the processes page to ``docs/web-processes.png``
(the README's screenshot); otherwise it goes to the test's temporary folder. Its ledger lies in
a folder of a tidy name, which is what the page's header shows of it (``…/example/ledger.db``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from playwright.sync_api import expect

from _shared import Processes, is_dead, run_cli, wait_until

from .conftest import Server, background, crash_loop

DOCS = Path(__file__).resolve().parents[2] / "docs"
EVIL = "<script>window.pwned=1</script><img src=x onerror=window.pwned=2>"


@pytest.fixture
def ledger(tmp_path: Path) -> str:
    """The ledger of every test here, in a folder named as an example's would be."""
    folder = tmp_path / "example"
    folder.mkdir()
    return f"sqlite:///{folder}/ledger.db"


def row(page: Any, process_id: str) -> Any:
    return page.locator(f'tr[data-id="{process_id}"]')


def seen(page: Any) -> list[str]:
    return list(page.evaluate("window.procledger.seen"))


def test_a_new_process_appears_live_and_turns_exited(
    page: Any, ledger: str, procs: Processes, tmp_path: Path
) -> None:
    record = background(ledger, procs, "sh", "-c", "sleep 1.5")
    expect(row(page, record["id"])).to_be_visible(timeout=1_000)  # no reload
    expect(row(page, record["id"]).locator("td.state")).to_have_text("running")
    expect(row(page, record["id"]).locator("td.state")).to_have_text("exited", timeout=10_000)
    expect(row(page, record["id"]).locator("td.outcome")).to_have_text("exit 0")
    assert page.evaluate("document.querySelectorAll('#processes tbody tr').length") == 1
    background(ledger, procs, "sleep", "600")
    named = background(ledger, procs, "sleep", "600", options=("--name", "web"))
    run_cli("run", "--", "sh", "-c", "exit 3", url=ledger)
    run_cli("run", "--", "sh", "-c", "echo hello from a supervised child", url=ledger)
    expect(page.locator("#processes tbody tr")).to_have_count(5)
    expect(row(page, named["id"])).to_contain_text("web")  # the web view shows names
    for status, n in (("any", 5), ("running", 2), ("completed", 2), ("failed", 1)):
        expect(page.locator(f'#counts a[data-status="{status}"] .n')).to_have_text(str(n))
    expect(page.locator("header .ledger")).to_have_text("…/example/ledger.db")
    expect(page.locator("header .ledger")).to_have_attribute("title", ledger)
    shot = page.screenshot(path=str(tmp_path / "web-processes.png"), full_page=True)
    assert shot.startswith(b"\x89PNG")
    if os.environ.get("PROCLEDGER_WRITE_SCREENSHOT") == "1":
        (DOCS / "web-processes.png").write_bytes(shot)


def test_stop_ends_a_running_sleep_and_the_page_shows_it(
    page: Any, server: Server, ledger: str, procs: Processes
) -> None:
    record = background(ledger, procs, "sleep", "600")
    child = procs.add(record["os_pid"])
    page.goto(f"{server.base}/processes/{record['id']}")
    state = page.locator('#record dd[data-field="state"]')
    expect(state).to_have_text("running (running)")
    page.select_option("#stop-mode", "interrupt")
    page.click("#stop")
    expect(page.locator("#said")).to_contain_text("Stop requested")
    expect(state).to_have_text("interrupted (cancelled)", timeout=10_000)
    expect(page.locator("#events td.kind").last).to_have_text("completed")
    expect(page.locator("#actions")).to_be_hidden()
    wait_until(lambda: is_dead(child), what="the sleep to end")


def test_the_output_pane_follows_a_child_line_by_line(
    page: Any, server: Server, ledger: str, procs: Processes
) -> None:
    script = "for i in $(seq 1 40); do echo line $i; sleep 0.1; done"
    record = background(ledger, procs, "sh", "-c", script)
    page.goto(f"{server.base}/processes/{record['id']}")
    output = page.locator("#output")
    expect(output).to_contain_text("line 3\n")
    with server.client() as client:  # the pane is following, not replaying a finished run
        assert client.get(f"/api/processes/{record['id']}").json()["record"]["state"] == "running"
    expect(output).to_contain_text("line 40\n", timeout=15_000)
    expect(page.locator("#output-note")).to_contain_text("ended")
    text = output.text_content() or ""
    assert text == "".join(f"line {i}\n" for i in range(1, 41))  # each line once, in order
    expect(page.locator('#record dd[data-field="state"]')).to_have_text("exited (completed)")


def test_after_a_server_restart_the_page_shows_every_change_exactly_once(
    page: Any, server: Server, ledger: str, procs: Processes
) -> None:
    before = background(ledger, procs, "sleep", "600")
    expect(row(page, before["id"])).to_be_visible()
    server.kill()
    expect(page.locator("#live")).to_have_attribute("data-state", "reconnecting")
    made = [run_cli("run", "--json", "--", "sh", "-c", f"exit {n}", url=ledger) for n in range(3)]
    ids = [orjson.loads(ran.stdout)["id"] for ran in made]
    stopped = run_cli("stop", before["id"], "--mode", "kill", url=ledger)
    assert stopped.returncode == 0, stopped.stderr
    server.start()
    expect(page.locator("#live")).to_have_attribute("data-state", "live", timeout=10_000)
    for n, process_id in enumerate(ids):
        expect(row(page, process_id).locator("td.outcome")).to_have_text(f"exit {n}")
    expect(row(page, before["id"]).locator("td.state")).to_have_text("killed")
    expect(page.locator("#processes tbody tr")).to_have_count(4)
    changes = seen(page)
    assert len(changes) == len(set(changes)), changes  # no change applied twice


def test_without_the_token_the_browser_gets_401_and_sees_nothing(
    browser: Any, server: Server, ledger: str
) -> None:
    ran = run_cli("run", "--", "sh", "-c", f"echo '{EVIL}'", url=ledger)
    assert ran.returncode == 0, ran.stderr
    process_id = orjson.loads(run_cli("ps", "--all", "--json", url=ledger).stdout)["records"][0][
        "id"
    ]
    context = browser.new_context()
    try:
        stranger = context.new_page()
        for path in ("/", f"/processes/{process_id}", "/stream/changes", "/api/processes"):
            answer = stranger.goto(server.base + path)
            assert answer is not None
            assert answer.status == 401
            assert process_id not in stranger.content()
        assert context.cookies() == []
    finally:
        context.close()


def test_argv_and_output_stay_text_in_the_browser(page: Any, server: Server, ledger: str) -> None:
    ran = run_cli("run", "--json", "--", "sh", "-c", f"echo '{EVIL}'", url=ledger)
    process_id = orjson.loads(ran.stdout)["id"]
    command = row(page, process_id).locator("td.command")
    expect(command).to_contain_text("<script>window.pwned=1</script>")  # live row, as text
    page.goto(f"{server.base}/processes/{process_id}")
    expect(page.locator("#output")).to_have_text(EVIL + "\n")
    expect(page.locator("#command")).to_contain_text("<img src=x")
    assert page.evaluate("window.pwned") is None
    assert page.locator("#output script, #output img, td.command img").count() == 0
    assert re.search(r"&lt;script&gt;", page.content())


def test_a_service_stays_one_live_row_showing_its_newest_attempt(page: Any, ledger: str) -> None:
    """As `ps` lists it (docs/design.md §15.4, §16): each new attempt replaces the row."""
    crash_loop(ledger, 2)
    newest = orjson.loads(run_cli("ps", "--all", "--json", url=ledger).stdout)["records"][0]
    assert newest["attempt"] == 3
    expect(row(page, newest["id"])).to_be_visible(timeout=5_000)
    expect(page.locator("#processes tbody tr")).to_have_count(1)
    page.reload()
    expect(row(page, newest["id"])).to_be_visible()
    expect(page.locator("#processes tbody tr")).to_have_count(1)
