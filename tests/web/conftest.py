"""Fixtures for the web view (docs/design.md §16): real ``procledger serve`` processes on real
sockets, real children started through the CLI, and headless Chromium driven by Playwright.

- ``Server``: ``procledger serve`` as a child process on a free loopback port with a known
  token; ``kill`` (SIGKILL, by exact pid) and ``start`` again on the same port.
- ``background``: ``procledger run --background`` of a command, its supervisor and child
  recorded for cleanup by exact pid.
- ``browser``: the system's Chromium (Debian's ``chromium``), launched once per session with
  ``executable_path`` -- nothing is downloaded. Without it (or without Playwright) the browser
  tests skip locally and fail in CI (``CI=true``), as the PostgreSQL tests do.
"""

from __future__ import annotations

import contextlib
import select
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil
import pytest

from _shared import CLI, IN_CI, Processes, child_env, run_cli

TOKEN = "test-token-0123456789"
BROWSERS = ("chromium", "chromium-browser")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """``procledger --url URL serve`` in a child process; ``url`` is its base address."""

    def __init__(self, ledger: str, procs: Processes, port: int | None = None) -> None:
        self.ledger = ledger
        self.procs = procs
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Server:
        """Start it and return once the URL is printed: the socket is listening by then."""
        argv = [*CLI, "--url", self.ledger, "serve", "--port", str(self.port), "--token", TOKEN]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env()
        )
        self.procs.add(self.proc.pid)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline().decode() if ready else ""
        assert f"127.0.0.1:{self.port}/?token={TOKEN}" in line, (line, self._stderr())
        return self

    def _stderr(self) -> str:
        if self.proc is None or self.proc.poll() is None:
            return ""
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode(errors="replace")

    def kill(self) -> None:
        """SIGKILL, by its exact pid: no graceful shutdown, streams cut mid-flight."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    stream.close()
            self.proc = None

    def token_url(self, path: str = "/") -> str:
        return f"{self.base}{path}?token={TOKEN}"

    def client(self, *, authorized: bool = True) -> httpx.Client:
        headers = {"Authorization": f"Bearer {TOKEN}"} if authorized else {}
        return httpx.Client(base_url=self.base, headers=headers, timeout=10)


@pytest.fixture
def ledger(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/ledger.db"


@pytest.fixture
def server(ledger: str, procs: Processes) -> Iterator[Server]:
    running = Server(ledger, procs).start()
    yield running
    running.kill()


def background(
    url: str, procs: Processes, *argv: str, options: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``procledger run --background [OPTIONS] -- ARGV``: the record once the command runs; its
    supervisor and child are recorded for cleanup by exact pid."""
    ran = run_cli("run", "--background", "--json", *options, "--", *argv, url=url)
    assert ran.returncode == 0, ran.stderr
    record: dict[str, Any] = orjson.loads(ran.stdout)
    for pid in (record["first_started"]["owner"]["liveness"]["pid"], record["os_pid"]):
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.add(pid)
    return record


def crash_loop(url: str, max_restarts: int) -> None:
    """A service that exits 3 every attempt until its budget of ``max_restarts`` is spent
    (``crash_loop``), run in the foreground: every attempt has ended when this returns."""
    ran = run_cli(
        "run",
        "--restart", "always", "--max-restarts", str(max_restarts), "--backoff-initial", "0.05s",
        "--", "sh", "-c", "exit 3",
        url=url,
    )  # fmt: skip
    assert ran.returncode == 3, ran.stderr


def chromium() -> str | None:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless system Chromium, one per test module; skips locally, fails in CI, without it.

    Not one per session: while Playwright's sync API is open, its event loop counts as running
    on the worker's main thread, so any later test of the same worker that runs an event loop
    (``asyncio.run``, ``anyio.run``: the README's async example, the aio tests) failed with
    "Cannot run the event loop while another loop is running" -- whenever xdist happened to
    give that worker a browser test first."""
    path = chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        path = None
    if path is None:
        message = "no chromium (or no playwright) for the browser tests"
        if IN_CI:
            pytest.fail(f"{message}: .ci/run installs Debian's chromium")
        pytest.skip(f"{message} (apt-get install chromium; pip install -e '.[dev]')")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=path, headless=True)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any, server: Server) -> Iterator[Any]:
    """A fresh browser context (no cookie) on the processes page, signed in by the token URL."""
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    opened = context.new_page()
    opened.set_default_timeout(10_000)
    opened.goto(server.token_url())
    opened.wait_for_selector('#live[data-state="live"]')
    yield opened
    context.close()
