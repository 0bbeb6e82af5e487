"""The web view on a PostgreSQL ledger, in the browser: the same live page as on SQLite
(docs/design.md §16). The ``ledger`` fixture is overridden here; ``server`` and ``page`` use it."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from _shared import Processes, run_cli

from .conftest import Server, background
from .test_metrics import scrape

pytestmark = pytest.mark.postgres


@pytest.fixture
def ledger(postgres_schema_url: str) -> str:
    return postgres_schema_url


def test_rows_appear_and_stop_works_on_postgresql(
    page: Any, server: Server, ledger: str, procs: Processes
) -> None:
    record = background(ledger, procs, "sleep", "600")
    state = page.locator(f'tr[data-id="{record["id"]}"] td.state')
    expect(state).to_have_text("running", timeout=1_000)
    ran = run_cli("run", "--json", "--", "sh", "-c", "exit 4", url=ledger)
    assert ran.returncode == 4, ran.stderr
    expect(page.locator("#processes tbody tr")).to_have_count(2)
    page.goto(f"{server.base}/processes/{record['id']}")
    page.select_option("#stop-mode", "terminate")
    page.click("#stop")
    expect(page.locator('#record dd[data-field="state"]')).to_have_text(
        "terminated (cancelled)", timeout=10_000
    )


def test_metrics_on_postgresql(server: Server, ledger: str) -> None:
    ran = run_cli("run", "--json", "--", "sh", "-c", "exit 4", url=ledger)
    assert ran.returncode == 4, ran.stderr
    samples = scrape(server.base)
    assert samples["procledger_processes", (("state", "exited"),)] == 1
    ends = ("procledger_process_ends_total", (("reason", "exited"), ("state", "exited")))
    assert samples[ends] == 1
    assert samples["procledger_feed_lag_changes", ()] == 0
