"""Counts per status above the processes list, and resources in the web view (docs/design.md
§16.4): the counts over the whole ledger, rendered with the page and kept live by its stream;
an ended run's resources (the record's) and a running one's live sample (the host agent's) on
its page. Real servers, real children, headless Chromium; waits are Playwright's, bounded.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest
from playwright.sync_api import expect

from _shared import Processes, child_env, end_process, is_dead, run_cli, start_cli, wait_until
from procledger import (
    Originator,
    ProcessInput,
    ProcessRecord,
    ProcessRegistration,
    RecoveryDisposition,
    open_registry,
)
from procledger.agent.resources import INTERVAL_ENV
from procledger.domain.registration import env_ref_for
from procledger.domain.vocabulary import ProcessStatus
from procledger.web.views import StatusCounts, ledger_label

from .conftest import Server, background, crash_loop

MIB = 2**20
ALLOCATES = (
    "import time\n"
    "block = bytearray(64 * 1024 * 1024)\n"
    "for at in range(0, len(block), 4096):\n"
    "    block[at] = 1\n"
    "print('allocated', flush=True)\n"
    "time.sleep(300)\n"
)
"""A child whose RSS is at least 64 MiB once it says ``allocated``, and stays so."""


# -- StatusCounts, the pure count ------------------------------------------------------------


@pytest.fixture(scope="module")
def model() -> Iterator[ProcessRecord]:
    """One real record, copied with other ids, statuses and positions by ``record``."""
    registry = open_registry("memory://")
    try:
        registration = ProcessRegistration(
            id="model",
            input=ProcessInput.command(["true"]),
            disposition=RecoveryDisposition.owner_bound,
            originator=Originator.host(),
            env_ref=env_ref_for({"PATH": "/usr/bin"}),
        )
        yield registry.register(registration)
    finally:
        registry.close()


def record(
    model: ProcessRecord, pid: str, status: str, seq: int, of: str | None = None
) -> ProcessRecord:
    """``model`` as process ``pid`` at change ``seq`` with ``status``; ``of``: an attempt (>1)
    of the service whose first id it is."""
    return model.model_copy(
        update={
            "id": pid,
            "status": ProcessStatus(status),
            "change_seq": seq,
            "attempt": None if of is None else 2,
            "attempt_of": of,
        }
    )


def zero(**counts: int) -> dict[str, int]:
    return {"any": 0} | {s.value: 0 for s in ProcessStatus} | counts


def test_a_process_counts_once_under_its_latest_status(model: ProcessRecord) -> None:
    counts = StatusCounts()
    counts.add(record(model, "a", "running", 1))
    counts.add(record(model, "b", "failed", 2))
    assert counts.counts() == zero(any=2, running=1, failed=1)
    counts.add(record(model, "a", "cancelled", 3))
    assert counts.counts() == zero(any=2, cancelled=1, failed=1)
    counts.add(record(model, "a", "running", 1))  # an older copy read later changes nothing
    assert counts.counts() == zero(any=2, cancelled=1, failed=1)


def test_a_service_is_one_row_under_each_status_its_attempts_have(model: ProcessRecord) -> None:
    """As the list filtered by a status shows it: once, if any attempt has that status."""
    counts = StatusCounts()
    counts.add(record(model, "s", "failed", 1))
    counts.add(record(model, "s.2", "failed", 2, of="s"))
    assert counts.counts() == zero(any=1, failed=1)
    counts.add(record(model, "s.3", "running", 3, of="s"))
    assert counts.counts() == zero(any=1, failed=1, running=1)
    counts.add(record(model, "s.3", "completed", 4, of="s"))
    assert counts.counts() == zero(any=1, failed=1, completed=1)


def test_the_version_grows_only_when_a_count_changes(model: ProcessRecord) -> None:
    counts = StatusCounts()
    counts.add(record(model, "a", "running", 1))
    version = counts.version
    counts.add(record(model, "a", "running", 2))  # a change that keeps its status
    counts.add(record(model, "a", "running", 2))
    assert counts.version == version
    counts.add(record(model, "a", "completed", 3))
    assert counts.version > version


@pytest.mark.parametrize(
    ("path", "shown"),
    [
        ("/tmp/pytest-of-me/pytest-7/test_x0/example/ledger.db", "…/example/ledger.db"),
        ("/home/me/ledger.db", "~/ledger.db"),
        ("/home/me/jobs/ledger.db", "~/jobs/ledger.db"),
        ("/home/me/a/b/ledger.db", "…/b/ledger.db"),
        ("/srv/ledger.db", "/srv/ledger.db"),
    ],
)
def test_the_header_names_a_sqlite_ledger_by_its_folder_and_file(path: str, shown: str) -> None:
    masked = f"sqlite:///{path}"
    assert ledger_label(masked, path, default=False, home="/home/me") == shown


def test_the_header_names_other_ledgers_as_before() -> None:
    pg = "postgresql://me:***@db:5432/jobs"
    assert ledger_label(pg, "", default=False, home="/home/me") == pg
    assert ledger_label("x", "/home/me/.local/x.db", default=True, home="/home/me") == (
        "the default ledger"
    )


# -- the counts in a browser -----------------------------------------------------------------


def shown_counts(page: Any) -> dict[str, str]:
    links = page.locator("#counts a[data-status]")
    return {
        links.nth(i).get_attribute("data-status"): links.nth(i).locator(".n").text_content()
        for i in range(links.count())
    }


def count(page: Any, status: str) -> Any:
    return page.locator(f'#counts a[data-status="{status}"] .n')


def rendered_counts(html: str) -> dict[str, str]:
    """The counts as the server wrote them into the page (before any script ran)."""
    found = re.findall(r'data-status="(\w+)"[^>]*>.*?<span class="n">([^<]*)</span>', html)
    return dict(found)


def test_the_counts_cover_the_whole_ledger_at_load_and_link_to_their_list(
    page: Any, server: Server, ledger: str
) -> None:
    crash_loop(ledger, 2)  # one service, three failed attempts: one row
    for code in (0, 0, 3):
        assert run_cli("run", "--", "sh", "-c", f"exit {code}", url=ledger).returncode == code
    expected = {
        "any": "4",
        "running": "0",
        "completed": "2",
        "failed": "2",
        "cancelled": "0",
        "abandoned": "0",
    }
    with server.client() as client:  # rendered by the server, even on a page of two rows
        wait_until(
            lambda: rendered_counts(client.get("/?limit=2").text) == expected,
            20,
            "the counts in the page",
        )
    page.goto(server.base + "/?limit=2")
    expect(page.locator("#processes tbody tr")).to_have_count(2)
    assert shown_counts(page) == expected
    page.click('#counts a[data-status="failed"]')
    expect(page).to_have_url(re.compile(r"/\?status=failed$"))
    expect(page.locator("#processes tbody tr")).to_have_count(2)
    expect(page.locator('#counts a[aria-current="page"]')).to_have_attribute(
        "data-status", "failed"
    )


def test_the_counts_follow_a_process_starting_and_stopping_without_a_reload(
    page: Any, ledger: str, procs: Processes
) -> None:
    counts_follow_a_start_and_a_stop(page, ledger, procs)


@pytest.mark.postgres
class TestOnPostgreSQL:
    @pytest.fixture
    def ledger(self, postgres_schema_url: str) -> str:
        return postgres_schema_url

    def test_the_counts_follow_and_the_header_masks_the_password(
        self, page: Any, ledger: str, procs: Processes
    ) -> None:
        header = page.locator("header .ledger")
        expect(header).to_contain_text("postgresql://")
        if urlsplit(ledger).password:
            expect(header).to_contain_text(":***@")
        counts_follow_a_start_and_a_stop(page, ledger, procs)

    def test_records_pruned_leave_the_counts(self, page: Any, ledger: str) -> None:
        pruned_records_leave_the_counts(page, ledger)


def counts_follow_a_start_and_a_stop(page: Any, ledger: str, procs: Processes) -> None:
    """A finished `true`, then a `sleep` started in the background and stopped: the counts
    move with each, without a reload."""
    assert run_cli("run", "--", "true", url=ledger).returncode == 0
    expect(count(page, "completed")).to_have_text("1")
    expect(count(page, "running")).to_have_text("0")
    record = background(ledger, procs, "sleep", "600")
    child = procs.add(record["os_pid"])
    expect(count(page, "running")).to_have_text("1", timeout=5_000)
    expect(count(page, "any")).to_have_text("2")
    stopped = run_cli("stop", record["id"], url=ledger)
    assert stopped.returncode == 0, stopped.stderr
    expect(count(page, "running")).to_have_text("0", timeout=10_000)
    expect(count(page, "cancelled")).to_have_text("1")
    expect(count(page, "any")).to_have_text("2")
    expect(count(page, "completed")).to_have_text("1")
    assert page.evaluate("window.procledger.seen.length") >= 3  # the page was never reloaded
    wait_until(lambda: is_dead(child), what="the sleep to end")


def test_records_pruned_leave_the_counts_without_a_reload(page: Any, ledger: str) -> None:
    pruned_records_leave_the_counts(page, ledger)


def pruned_records_leave_the_counts(page: Any, ledger: str) -> None:
    """A prune writes nothing to the feed: the hub, woken by its write, reads that there was
    one and which counted records are gone."""
    for code in (0, 0, 3):
        assert run_cli("run", "--", "sh", "-c", f"exit {code}", url=ledger).returncode == code
    expect(count(page, "completed")).to_have_text("2", timeout=10_000)
    expect(count(page, "failed")).to_have_text("1")
    registry = open_registry(ledger)
    try:
        report = registry.prune_terminal(registry.now_ms() + 1, {"status": "completed"})
    finally:
        registry.close()
    assert len(report.processes) == 2
    expect(count(page, "completed")).to_have_text("0", timeout=10_000)
    expect(count(page, "failed")).to_have_text("1")
    expect(count(page, "any")).to_have_text("1")


def test_a_page_of_a_server_started_on_a_full_ledger_learns_its_counts(
    browser: Any, ledger: str, procs: Processes
) -> None:
    """The counts are read once when serve starts; the stream sends them to a page that was
    rendered before (or that reconnects after a restart)."""
    for code in (0, 1):
        run_cli("run", "--", "sh", "-c", f"exit {code}", url=ledger)
    started = Server(ledger, procs).start()
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(started.token_url())
        expect(count(page, "completed")).to_have_text("1", timeout=10_000)
        expect(count(page, "failed")).to_have_text("1")
        expect(count(page, "any")).to_have_text("2")
    finally:
        context.close()
        started.kill()


def test_a_bad_filter_is_still_a_400_and_a_stream_without_counts_sends_none(
    server: Server,
) -> None:
    with server.client() as client:
        assert client.get("/?status=bogus").status_code == 400
        assert client.get("/?state=nothing").status_code == 400
        with client.stream("GET", "/stream/changes?counts=1") as answer:
            told, deadline = "", time.monotonic() + 20  # a keep-alive every 15 s ends a read
            for text in answer.iter_text():  # on open, or once the first count is over
                told += text
                if "event: counts" in told or time.monotonic() > deadline:
                    break
            assert '"any":0' in told
        with client.stream("GET", "/stream/changes?counts=no") as answer:
            first = next(answer.iter_text())
            assert "counts" not in first


# -- resources -------------------------------------------------------------------------------


@pytest.mark.skipif(sys.platform != "linux", reason="the agent is Linux only")
def test_a_process_page_shows_the_live_sample_then_the_peak_rss_once_it_ended(
    page: Any, server: Server, ledger: str, procs: Processes
) -> None:
    started = run_cli("agent", "start", url=ledger, env=agent_env())
    assert started.returncode == 0, started.stderr
    record = background(ledger, procs, sys.executable, "-c", ALLOCATES)
    pid = record["id"]

    def sampled() -> bool:
        listed = orjson.loads(run_cli("ps", "--resources", "--json", url=ledger).stdout)
        sample = listed["resources"].get(pid)
        return bool(sample) and sample["rss_bytes"] >= 64 * MIB

    wait_until(sampled, 30, "a live sample of 64 MiB")
    page.goto(f"{server.base}/processes/{pid}")
    resources = page.locator('#record dd[data-field="resources"]')
    expect(resources).to_contain_text("now: CPU")
    assert megabytes(resources.text_content(), "RSS") >= 64
    assert run_cli("stop", pid, url=ledger).returncode == 0
    expect(resources).to_contain_text("peak RSS", timeout=15_000)  # the page follows, no reload
    assert megabytes(resources.text_content(), "peak RSS") >= 64
    with server.client() as client:
        used = client.get(f"/api/processes/{pid}").json()["record"]["resources"]
    assert used["peak_rss_bytes"] >= 64 * MIB


def test_without_an_agent_a_running_process_page_shows_no_resources(
    page: Any, server: Server, ledger: str, procs: Processes
) -> None:
    """A foreground `procledger run` has no agent: nothing live is guessed."""
    pidfile = procs.pidfile("sleep.pid")
    script = f'echo $$ > "{pidfile}"; exec sleep 600'
    runner = start_cli("run", "--", "sh", "-c", script, url=ledger, procs=procs)
    try:
        procs.await_pid(pidfile)
        listed = orjson.loads(run_cli("ps", "--json", url=ledger).stdout)["records"]
        page.goto(f"{server.base}/processes/{listed[0]['id']}")
        expect(page.locator('#record dd[data-field="state"]')).to_have_text("running (running)")
        assert page.locator('#record dd[data-field="resources"]').count() == 0
    finally:
        end_process(runner)


def agent_env() -> dict[str, str]:
    """The test's environment for the agent, which samples every 0.2 s."""
    env = child_env(**{INTERVAL_ENV: "0.2"})
    env.pop("PROCLEDGER_URL", None)
    return env


def megabytes(text: str | None, after: str) -> float:
    """The size after ``after`` in a resources line (``RSS 64.2M``), in MiB."""
    found = re.search(re.escape(after) + r" ([\d.]+)([KMG])", text or "")
    assert found, text
    scale = {"K": 1 / 1024, "M": 1.0, "G": 1024.0}[found.group(2)]
    return float(found.group(1)) * scale
