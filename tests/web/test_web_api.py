"""The web view without a browser (docs/design.md §16): the token gate, the JSON API in the
CLI's ``--json`` shapes, escaping, CSRF, the loopback rule, and two servers on one ledger."""

from __future__ import annotations

import select
import signal
import subprocess
from pathlib import Path

import httpx
import orjson
import pytest

from _shared import CLI, Processes, child_env, end_process, run_cli, wait_until

from .conftest import TOKEN, Server, background, crash_loop

EVIL = "<script>window.pwned=1</script><img src=x onerror=window.pwned=2>"


def test_without_the_token_everything_is_refused_and_nothing_leaks(
    server: Server, ledger: str
) -> None:
    ran = run_cli("run", "--", "sh", "-c", f"echo '{EVIL}'", url=ledger)
    assert ran.returncode == 0, ran.stderr
    (record,) = orjson.loads(run_cli("ps", "--all", "--json", url=ledger).stdout)["records"]
    pid = record["id"]
    paths = [
        "/",
        f"/processes/{pid}",
        f"/processes/{pid}/output/stream",
        "/stream/changes?cursor=0",
        "/api/processes?status=any",
        f"/api/processes/{pid}",
        f"/api/processes/{pid}/output",
        "/api/feed",
        "/static/app.js",
        "/no/such/page",
    ]
    with server.client(authorized=False) as anonymous:
        for path in paths:
            for headers in (
                {},
                {"Authorization": "Bearer wrong"},
                {"Cookie": "procledger_session=x"},
            ):
                answer = anonymous.get(path, headers=headers)
                assert answer.status_code == 401, path
                assert pid not in answer.text
                assert "pwned" not in answer.text
        for action in ("stop", "abandon"):
            assert anonymous.post(f"/processes/{pid}/{action}").status_code == 401
            assert anonymous.post(f"/api/processes/{pid}/{action}").status_code == 401
        assert anonymous.get("/", params={"token": TOKEN[:-1]}).status_code == 401


def test_the_token_url_becomes_a_strict_http_only_cookie(server: Server) -> None:
    with server.client(authorized=False) as browserless:
        answer = browserless.get("/", params={"token": TOKEN, "status": "any"})
        assert answer.status_code == 303
        assert answer.headers["location"] == "/?status=any"  # the token leaves the address
        cookie = answer.headers["set-cookie"]
        assert "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie
        assert TOKEN not in cookie
        page = browserless.get("/")
        assert page.status_code == 200
        assert "script-src 'self'" in page.headers["content-security-policy"]


def test_the_api_mirrors_the_cli_json(server: Server, ledger: str, procs: Processes) -> None:
    sleeping = background(ledger, procs, "sleep", "600")
    ran = run_cli("run", "--", "sh", "-c", "echo out; echo err >&2", url=ledger)
    assert ran.returncode == 0, ran.stderr
    cli_ps = orjson.loads(run_cli("ps", "--all", "--json", url=ledger).stdout)
    with server.client() as client:
        assert client.get("/api/processes", params={"status": "any"}).json() == cli_ps
        running = client.get("/api/processes").json()["records"]
        assert [r["id"] for r in running] == [r["id"] for r in cli_ps["records"]]
        finished = cli_ps["records"][-1]["id"]
        shown = orjson.loads(run_cli("show", finished, "--json", url=ledger).stdout)
        assert client.get(f"/api/processes/{finished[:12]}").json() == shown
        logs = run_cli("logs", finished, "--json", url=ledger).stdout.splitlines()
        assert client.get(f"/api/processes/{finished}/output").json() == [
            orjson.loads(line) for line in logs
        ]
        feed = run_cli("feed", "--json", url=ledger).stdout.splitlines()
        assert client.get("/api/feed").json() == [orjson.loads(line) for line in feed]
        assert client.get("/api/processes/nope").status_code == 404
        stopped = client.post(f"/api/processes/{sleeping['id']}/stop", json={"mode": "kill"})
        assert stopped.status_code == 200, stopped.text
        assert stopped.json()["result"] == "asked"
    final = wait_until(
        lambda: (
            (r := run_cli("show", sleeping["id"], "--json", url=ledger)).returncode == 0
            and orjson.loads(r.stdout)["record"]["state"] == "killed"
            and r
        ),
        what="the stop to be carried out",
    )
    assert final


@pytest.mark.parametrize("value", ["abc", "-5", "1.5"])
def test_a_count_parameter_that_is_no_count_is_a_400_naming_it(server: Server, value: str) -> None:
    with server.client() as client:
        for path, name in [
            ("/api/feed", "since"),
            ("/api/feed", "limit"),
            ("/api/processes/nope/output", "since_offset"),
        ]:
            answer = client.get(path, params={name: value})
            assert answer.status_code == 400, (path, name, answer.text)
            assert answer.json()["message"] == (
                f"{name} must be a whole number of at least 0, not {value!r}"
            )


def test_a_ledger_that_cannot_be_opened_is_one_error_line_and_no_url(tmp_path: Path) -> None:
    """It used to print the URL, then uvicorn's traceback of the failed start-up (exit 3)."""
    result = run_cli("serve", "--port", "0", url=f"sqlite:///{tmp_path}/no-such-folder/l.db")
    assert result.returncode == 1, result
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert "no-such-folder" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_ctrl_c_ends_serve_with_130(ledger: str, procs: Processes) -> None:
    """As every command stopped on request (docs/design.md §8); it exited 0."""
    server = Server(ledger, procs).start()
    assert server.proc is not None
    try:
        server.proc.send_signal(signal.SIGINT)  # what Ctrl-C at its terminal sends
        assert server.proc.wait(timeout=30) == 130
    finally:
        server.kill()


def test_an_address_serve_cannot_listen_on_is_one_error_line(ledger: str, procs: Processes) -> None:
    """A port in use, or a host that is no address here: named in one line, before any
    warning or URL (it printed the non-loopback warning, then a bare gaierror)."""
    busy = Server(ledger, procs).start()
    try:
        for args in (
            ("--port", str(busy.port)),
            ("--host", "999.1.1.1", "--port", "0", "--token", TOKEN),
        ):
            refused = run_cli("serve", *args, url=ledger)
            assert refused.returncode == 1, refused
            assert refused.stdout == ""
            assert "Traceback" not in refused.stderr
            assert refused.stderr.count("\n") == 1, refused.stderr
            assert "cannot listen on" in refused.stderr
    finally:
        busy.kill()


def test_actions_need_the_csrf_token_with_a_cookie(
    server: Server, ledger: str, procs: Processes
) -> None:
    sleeping = background(ledger, procs, "sleep", "600")
    with server.client(authorized=False) as browserless:
        browserless.get("/", params={"token": TOKEN})  # the session cookie
        page = browserless.get(f"/processes/{sleeping['id']}").text
        refused = browserless.post(f"/processes/{sleeping['id']}/stop", data={"mode": "kill"})
        assert refused.status_code == 403
        foreign = browserless.post(
            f"/processes/{sleeping['id']}/stop",
            data={"mode": "kill", "csrf": "x"},
            headers={"Origin": "http://evil.example"},
        )
        assert foreign.status_code == 403
        csrf = page.split('name="csrf" value="')[1].split('"')[0]
        done = browserless.post(
            f"/processes/{sleeping['id']}/stop", data={"mode": "kill", "csrf": csrf}
        )
        assert done.status_code == 303
        assert done.headers["location"].endswith("?said=asked")


def test_argv_and_output_are_escaped_in_every_page(server: Server, ledger: str) -> None:
    ran = run_cli("run", "--", "sh", "-c", f"echo '{EVIL}'", url=ledger)
    assert ran.returncode == 0, ran.stderr
    with server.client() as client:
        (record,) = client.get("/api/processes", params={"status": "any"}).json()["records"]
        for path in ("/", f"/processes/{record['id']}"):
            text = client.get(path).text
            assert "<script>window" not in text
            assert "<img" not in text
            assert "&lt;script&gt;window.pwned=1&lt;/script&gt;" in text
        stream = client.get(f"/processes/{record['id']}/output/stream").text
        assert "<script>" in stream  # JSON data for textContent, never markup
        assert client.get("/api/processes", params={"status": "nonsense"}).status_code == 400


def test_a_non_loopback_address_needs_an_explicit_token(ledger: str) -> None:
    refused = run_cli("serve", "--host", "0.0.0.0", "--port", "0", url=ledger)
    assert refused.returncode == 2
    assert "--token" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_non_loopback_address_with_a_token_is_served_with_a_warning(
    ledger: str, procs: Processes
) -> None:
    argv = [*CLI, "--url", ledger, "serve", "--host", "0.0.0.0", "--port", "0"]
    proc = subprocess.Popen(
        [*argv, "--token", TOKEN], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env()
    )
    procs.add(proc.pid)
    try:
        assert proc.stdout is not None
        assert proc.stderr is not None
        ready, _, _ = select.select([proc.stderr], [], [], 30)
        assert ready
        assert (
            "warning: 0.0.0.0 is reachable from other machines" in proc.stderr.readline().decode()
        )
        port = int(proc.stdout.readline().decode().split("0.0.0.0:")[1].split("/")[0])
        answer = httpx.get(f"http://127.0.0.1:{port}/api/feed", timeout=10)
        assert answer.status_code == 401
    finally:
        end_process(proc)


@pytest.mark.slow
def test_two_servers_on_one_ledger_show_the_same_state(shared_url: str, procs: Processes) -> None:
    first, second = Server(shared_url, procs).start(), Server(shared_url, procs).start()
    try:
        record = background(shared_url, procs, "sleep", "600")
        with first.client() as one, second.client() as two:
            stopped = two.post(f"/api/processes/{record['id']}/stop", json={"mode": "terminate"})
            assert stopped.status_code == 200, stopped.text

            def same_and_ended() -> bool:
                seen = [c.get(f"/api/processes/{record['id']}").json() for c in (one, two)]
                return seen[0] == seen[1] and seen[0]["record"]["state"] == "terminated"

            wait_until(same_and_ended, what="both servers to show the stop")
            assert one.get("/api/feed").json() == two.get("/api/feed").json()
    finally:
        first.kill()
        second.kill()


def test_output_not_kept_is_said_and_the_stream_ends(server: Server, ledger: str) -> None:
    ran = run_cli("run", "--json", "--no-capture", "--", "true", url=ledger)
    assert ran.returncode == 0, ran.stderr
    process_id = orjson.loads(ran.stdout)["id"]
    with server.client() as client:
        stream = client.get(f"/processes/{process_id}/output/stream").text
        assert "event: unavailable" in stream
        assert "without capture" in stream
        assert client.get(f"/api/processes/{process_id}/output").status_code == 404


def test_a_service_page_lists_its_attempts(server: Server, ledger: str) -> None:
    """A command run under a restart policy is a service (docs/design.md §15.4): each attempt's
    page lists every attempt with how it ended, and the last says why there are no more."""
    crash_loop(ledger, 1)
    records = orjson.loads(run_cli("ps", "--all", "--attempts", "--json", url=ledger).stdout)
    first, second = sorted(records["records"], key=lambda r: r["attempt"])
    with server.client() as client:
        page = client.get(f"/processes/{first['id']}").text
    assert 'id="service-attempts"' in page
    for record in (first, second):
        assert f'href="/processes/{record["id"]}"' in page
    assert page.count("exit 3") >= 2
    assert "crash_loop" in page


def test_the_api_lists_a_service_as_one_row_as_ps_does(server: Server, ledger: str) -> None:
    """`GET /api/processes` is `ps --json` (docs/design.md §16): a service's attempts are one
    row, its newest attempt -- as `ps` shows it, through the same selection (§5.2)."""
    crash_loop(ledger, 2)
    assert run_cli("run", "--", "true", url=ledger).returncode == 0
    cli_ps = orjson.loads(run_cli("ps", "--all", "--json", url=ledger).stdout)
    assert [r["attempt"] for r in cli_ps["records"]] == [3, None]
    with server.client() as client:
        assert client.get("/api/processes", params={"status": "any"}).json() == cli_ps
        newest = client.get("/api/processes", params={"status": "any", "limit": "1"}).json()
    newest_ps = orjson.loads(run_cli("ps", "--all", "--limit", "1", "--json", url=ledger).stdout)
    assert newest == newest_ps
    service = cli_ps["records"][0]
    with server.client() as client:
        page = client.get("/", params={"limit": "1", "before": cli_ps["records"][1]["id"]}).text
        older = client.get("/", params={"before": service["attempt_of"]}).text
    # The table too: one row for the service, showing its newest attempt, keyed by its first.
    assert page.count(f'data-service="{service["attempt_of"]}"') == 1
    assert f'data-id="{service["id"]}"' in page
    assert "data-service" not in older  # nothing before the service's first attempt
