"""The web view (docs/design.md §16) against a large ledger and many live clients, on localhost.

    PYTHONPATH=src python benchmarks/web.py [--processes 10000] [--clients 50] [--rate 100]
                                            [--seconds 10] [--loads 5]

1. A SQLite ledger of ``--processes`` finished processes (as ``benchmarks/startup.py`` builds
   them), served by a real ``procledger serve`` child process.
2. First page: headless Chromium (the system's ``chromium``, driven by Playwright) opens the
   processes page ``--loads`` times, in a fresh context each time; the time is the browser's
   ``load`` event from the navigation's start (Navigation Timing). Target (issue 19): < 1 s.
3. Live delivery: ``--clients`` SSE clients (in a child process, httpx) follow the change feed
   while this process registers ``--rate`` processes a second for ``--seconds``. A change's
   delay is from just *before* its write began to its arrival at a client, so the write's own
   time counts against the server. Every client must receive every change exactly once.
   Target: p99 < 250 ms.

Bounded: building the ledger takes about a minute for 10,000 processes; the rest ~20 s.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson

from _common import sqlite_ledger
from startup import child_env, populate

TOKEN = "bench-token"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serving(url: str) -> Iterator[str]:
    """``procledger serve`` on a free port; its base URL once it listens."""
    port = free_port()
    argv = [sys.executable, "-m", "procledger", "--url", url, "serve", "--port", str(port)]
    proc = subprocess.Popen([*argv, "--token", TOKEN], stdout=subprocess.PIPE, env=child_env())
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "serve did not start"
        assert TOKEN in proc.stdout.readline().decode(), "serve did not print its URL"
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        for folder in os.environ.get("PATH", "").split(os.pathsep):
            if Path(folder, name).is_file():
                return str(Path(folder, name))
    raise SystemExit("no chromium on PATH (apt-get install chromium)")


def page_loads(base: str, loads: int) -> list[float]:
    """Seconds from navigation start to the ``load`` event of the processes page."""
    from playwright.sync_api import sync_playwright

    times = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium(), headless=True)
        try:
            for _ in range(loads + 1):  # the first warms the server's caches and the browser's
                context = browser.new_context()
                context.add_cookies([_session_cookie(base)])
                page = context.new_page()
                page.goto(base + "/", wait_until="load")
                timing = page.evaluate(
                    "(() => { const n = performance.getEntriesByType('navigation')[0];"
                    " return [n.loadEventEnd - n.startTime, document.querySelectorAll("
                    "'#processes tbody tr').length]; })()"
                )
                assert timing[1] > 0, "the page listed no process"
                times.append(timing[0] / 1000)
                context.close()
        finally:
            browser.close()
    return times[1:]


def _session_cookie(base: str) -> Any:  # playwright's SetCookieParam
    """The session cookie the token URL sets (fetched once, outside the timing)."""
    answer = httpx.get(base + "/", params={"token": TOKEN}, follow_redirects=False)
    value = answer.headers["set-cookie"].split(";")[0].split("=", 1)[1]
    return {"name": "procledger_session", "value": value, "url": base}


# -- live delivery ---------------------------------------------------------------------------------


async def _client(
    base: str, cursor: int, arrivals: dict[str, float], done: asyncio.Event, connected: Any
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    url = f"{base}/stream/changes?cursor={cursor}"
    async with (
        httpx.AsyncClient(timeout=None) as client,
        client.stream("GET", url, headers=headers) as stream,
    ):
        connected.release()
        async for line in stream.aiter_lines():
            if line.startswith("data: "):
                row = orjson.loads(line[6:])["row"]
                now = time.time()
                if row["id"] in arrivals:
                    arrivals[row["id"] + "#dup"] = now
                arrivals[row["id"]] = now
            if done.is_set():
                return


def follow(base: str, cursor: int, clients: int, seconds: float, out: Any) -> None:
    """The clients, in a child process: each one's arrival times, sent back through ``out``."""

    async def main() -> list[dict[str, float]]:
        done = asyncio.Event()
        logs: list[dict[str, float]] = [{} for _ in range(clients)]
        connected = asyncio.Semaphore(0)
        tasks = [
            asyncio.create_task(_client(base, cursor, logs[i], done, connected))
            for i in range(clients)
        ]
        for _ in range(clients):  # every stream's headers arrived: the server follows for it
            await connected.acquire()
        out.send("ready")
        await asyncio.sleep(seconds)
        done.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return logs

    out.send(asyncio.run(main()))


def produce(url: str, rate: float, seconds: float) -> dict[str, float]:
    """Register ``rate`` processes a second for ``seconds``: each id and when its write began."""
    from procledger import (
        Originator,
        ProcessInput,
        ProcessRegistration,
        RecoveryDisposition,
        open_registry,
    )
    from procledger.domain.registration import env_ref_for

    began: dict[str, float] = {}
    registry = open_registry(url)
    try:
        start = time.time()
        for index in range(int(rate * seconds)):
            time.sleep(max(0.0, start + index / rate - time.time()))
            process_id = f"live-{index:06d}"
            began[process_id] = time.time()
            registry.register(
                ProcessRegistration(
                    id=process_id,
                    input=ProcessInput.command(["sleep", str(index)], cwd="/tmp"),
                    disposition=RecoveryDisposition.owner_bound,
                    originator=Originator.host(),
                    env_ref=env_ref_for({}),
                )
            )
    finally:
        registry.close()
    return began


def live(base: str, url: str, clients: int, rate: float, seconds: float) -> dict[str, Any]:
    cursor = _head(base)
    here, there = multiprocessing.Pipe()
    child = multiprocessing.get_context("fork").Process(
        target=follow, args=(base, cursor, clients, seconds + 3, there)
    )
    child.start()
    assert here.recv() == "ready"
    began = produce(url, rate, seconds)
    logs = here.recv()
    child.join(30)
    delays = [log[pid] - at for log in logs for pid, at in began.items() if pid in log]
    missing = sum(1 for log in logs for pid in began if pid not in log)
    twice = sum(1 for log in logs for key in log if key.endswith("#dup"))
    return {"delays": delays, "missing": missing, "twice": twice, "changes": len(began)}


def _head(base: str) -> int:
    """The feed's position now, from the processes page's stream URL."""
    page = httpx.get(base + "/", headers={"Authorization": f"Bearer {TOKEN}"}).text
    return int(page.split("cursor=")[1].split('"')[0])


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--loads", type=int, default=5)
    args = parser.parse_args()
    with sqlite_ledger() as url:
        started = time.perf_counter()
        populate(url, args.processes)
        print(
            f"ledger of {args.processes:,} processes built in {time.perf_counter() - started:.0f} s"
        )
        with serving(url) as base:
            loads = page_loads(base, args.loads)
            print(
                f"first page ({args.processes:,} processes), browser load event: median "
                f"{statistics.median(loads) * 1e3:.0f} ms, max {max(loads) * 1e3:.0f} ms "
                f"(target < 1000 ms)"
            )
            result = live(base, url, args.clients, args.rate, args.seconds)
    delays = result["delays"]
    print(
        f"{args.clients} SSE clients, {result['changes']} changes at {args.rate:.0f}/s: "
        f"delivery median {statistics.median(delays) * 1e3:.1f} ms, p99 "
        f"{percentile(delays, 0.99) * 1e3:.1f} ms, max {max(delays) * 1e3:.1f} ms "
        f"(target p99 < 250 ms); missing {result['missing']}, twice {result['twice']}"
    )


if __name__ == "__main__":
    main()
