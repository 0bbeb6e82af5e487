"""The timeline page in a real browser (docs/design.md §16.3): headless Chromium, driven by
Playwright, against ``procledger serve`` and children started through the CLI. Waits are
Playwright's own, each bounded; nothing sleeps to synchronise.

The ledger is ``ledger.db`` in a folder named ``example``, so the page's header names it
``…/example/ledger.db``, not a temporary path. ``PROCLEDGER_WRITE_SCREENSHOT=1``
also writes the timeline to ``docs/web-timeline.png`` (the README's picture); otherwise it
goes to the test's temporary folder.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from _shared import Processes, run_cli

from .conftest import Server, background, crash_loop

DOCS = Path(__file__).resolve().parents[2] / "docs"
LOOPING = (
    "--restart", "always", "--max-restarts", "40", "--restart-window", "1h",
    "--backoff-initial", "0.3s", "--backoff-max", "0.6s",
)  # fmt: skip
"""A service that keeps failing for the whole test (then its agent is killed)."""


@pytest.fixture
def ledger(tmp_path: Path) -> str:
    """In a folder named as an example's would be: what the page's header shows of it."""
    folder = tmp_path / "example"
    folder.mkdir()
    return f"sqlite:///{folder}/ledger.db"


def timeline(page: Any, server: Server, window: str = "5m") -> None:
    page.goto(f"{server.base}/timeline?window={window}")
    expect(page.locator("#live")).to_have_attribute("data-state", "live")
    page.evaluate("window.sameDocument = true")  # gone if the page is loaded again


def bars(page: Any, service: str) -> Any:
    return page.locator(f'#timeline-svg rect.bar[data-service="{service}"]')


def test_a_crash_looping_service_grows_live_and_a_bar_opens_its_attempt(
    page: Any, server: Server, ledger: str, procs: Processes
) -> None:
    timeline(page, server)
    service = background(ledger, procs, "sh", "-c", "sleep 0.3; exit 3", options=LOOPING)["id"]
    expect(bars(page, service).nth(1)).to_be_attached(timeout=10_000)  # drawn without reload
    seen = bars(page, service).count()
    expect(bars(page, service).nth(seen)).to_be_attached(timeout=10_000)  # and more come
    assert page.evaluate("window.sameDocument && window.procledgerTimeline.loads") == 1
    expect(bars(page, service).first).to_have_attribute("class", re.compile(r"\bfailed\b"))
    expect(bars(page, service).first).to_have_attribute("data-outcome", "failed")
    gaps = page.locator(f'#timeline-svg rect.gap[data-service="{service}"]')
    expect(gaps.first).to_be_attached()  # the backoff between two attempts
    rows = page.locator(f'#timeline-svg g.row[data-service="{service}"]')
    expect(rows).to_have_count(1)  # a service's attempts share one row
    bars(page, service).first.click()
    expect(page).to_have_url(re.compile(rf"/processes/{re.escape(service)}\.1$"))
    expect(page.locator('#record dd[data-field="id"]')).to_have_text(service)


def test_the_timeline_is_behind_the_token_and_a_bad_window_is_a_400(server: Server) -> None:
    with server.client(authorized=False) as stranger:
        for path in ("/timeline", "/api/timeline", "/api/timeline?ids=x"):
            assert stranger.get(path).status_code == 401
    with server.client() as client:
        for path in ("/timeline?window=soon", "/api/timeline?window=1s"):
            answer = client.get(path)
            assert answer.status_code == 400, answer.text
            assert "window" in answer.text
        found = client.get("/api/timeline").json()
        assert (found["window_ms"], found["spans"], found["truncated"]) == (3_600_000, [], False)


def test_stops_and_readiness_are_marked_live_and_the_picture_is_taken(
    page: Any, server: Server, ledger: str, procs: Processes, tmp_path: Path
) -> None:
    timeline(page, server, "20s")  # close up: what follows takes some ten seconds
    assert run_cli("run", "--", "sh", "-c", "sleep 0.5", url=ledger).returncode == 0
    crash_loop(ledger, 3)
    flag = tmp_path / "listening"
    ready = background(
        ledger, procs, "sh", "-c", f"touch {flag}; exec sleep 600",
        options=("--name", "web", "--ready-file", str(flag), "--wait-ready"),
    )  # fmt: skip
    job = background(ledger, procs, "sleep", "600", options=("--name", "nightly-report"))
    looping = background(
        ledger, procs, "sh", "-c", "sleep 0.8; exit 3", options=(*LOOPING, "--name", "worker")
    )
    with server.client() as client:
        answer = client.post(f"/api/processes/{job['id']}/stop", json={"mode": "terminate"})
        assert answer.status_code == 200, answer.text
    expect(page.locator(f'rect.ready-mark[data-id="{ready["id"]}"]')).to_have_count(1)
    expect(page.locator(f'rect.stop-mark[data-id="{job["id"]}"]')).to_have_count(1)
    stopped = page.locator(f'rect.bar[data-id="{job["id"]}"]')
    expect(stopped).to_have_attribute("data-outcome", "stopped", timeout=15_000)
    expect(bars(page, looping["id"]).nth(3)).to_be_attached(timeout=15_000)
    assert page.evaluate("window.sameDocument && window.procledgerTimeline.loads") == 1
    expect(page.locator("#timeline-svg g.row")).to_have_count(5)
    assert "ledger.db" in (page.locator("header .ledger").text_content() or "")
    chart = page.locator("#timeline").bounding_box()
    assert chart is not None
    whole = {"x": 0, "y": 0, "width": 1280, "height": chart["y"] + chart["height"] + 14}
    shot = page.screenshot(path=str(tmp_path / "web-timeline.png"), clip=whole)
    assert shot.startswith(b"\x89PNG")
    if os.environ.get("PROCLEDGER_WRITE_SCREENSHOT") == "1":
        (DOCS / "web-timeline.png").write_bytes(shot)
