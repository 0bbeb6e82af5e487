"""Named services end to end (docs/design.md §19): one live process per name across OS
processes, `up`/`down`/`restart` over a service file through the host agent, and the agent
bringing `up` services back after a reboot-like crash.

Every child is known by its recorded pid (``procs``: killed by exact pid at teardown); the
agent's tree is killed by ``tests/conftest.py``'s autouse fixture.
"""

from __future__ import annotations

import socket
import subprocess
import textwrap
from pathlib import Path

import orjson
import psutil
import pytest
from tests.agent.live_agent import DEADLINE, LiveAgent

from _shared import CLI, Processes, child_env, run_cli, wait_until
from procledger import ProcessRecord, open_registry

SERVER = "import http.server, os; http.server.HTTPServer(('127.0.0.1', int(os.environ['PORT'])), http.server.BaseHTTPRequestHandler).serve_forever()"  # noqa: E501
"""A service that is ready once it listens on its leased $PORT."""


def service_file(folder: Path, worker_sleep: str = "1") -> Path:
    """A database-like dependency, a web server on it, and a worker on the web server."""
    (folder / "server.py").write_text(SERVER)
    path = folder / "procledger.toml"
    path.write_text(
        textwrap.dedent(
            f"""\
            [services.db]
            command = ["python3", "server.py"]
            port = "auto"

            [services.web]
            command = ["python3", "server.py"]
            port = "auto"
            depends_on = ["db"]

            [services.worker]
            command = "while true; do echo tick; sleep {worker_sleep}; done"
            depends_on = ["web"]
            """
        )
    )
    return path


def named(url: str, name: str) -> list[ProcessRecord]:
    """Every process the ledger holds under ``name``, by creation."""
    registry = open_registry(url)
    try:
        records = [r for r in registry.list_processes({"status": "any"}) if r.name == name]
    finally:
        registry.close()
    return sorted(records, key=lambda r: (r.created_at_ms, r.attempt or 0))


def own_children(url: str, procs: Processes) -> None:
    """Know every child on record by its pid, so teardown kills it even once its agent is
    gone."""
    registry = open_registry(url)
    try:
        for record in registry.list_processes({"status": "any"}):
            if record.os is not None and psutil.pid_exists(record.os.pid):
                procs.add(record.os.pid)
    finally:
        registry.close()


def cli_in(folder: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = child_env()
    env.pop("PROCLEDGER_URL", None)
    return subprocess.run(
        [*CLI, "--url", url, *args], capture_output=True, text=True, timeout=120,
        env=env, cwd=folder, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("background", [True, False], ids=["background", "foreground"])
def test_twenty_concurrent_runs_of_one_name_start_one_child(
    shared_url: str, background: bool, procs: Processes
) -> None:
    if background:
        LiveAgent(shared_url).start()
    env = child_env()
    env.pop("PROCLEDGER_URL", None)
    mode = ["--background"] if background else []
    runs = [
        subprocess.Popen(
            [*CLI, "--url", shared_url, "run", *mode, "--name", "dev", "--", "sleep", "300"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(20)
    ]
    for run in runs:
        procs.add(run.pid)
    answering = 20 if background else 19  # in the foreground, the one that runs it stays
    wait_until(lambda: sum(run.poll() is not None for run in runs) >= answering, 120, "the answers")
    own_children(shared_url, procs)
    records = named(shared_url, "dev")
    assert len(records) == 1, [r.id for r in records]
    (only,) = records
    assert only.state.value == "running"
    answered = [run for run in runs if run.poll() is not None]
    assert len(answered) == answering
    outputs = [run.communicate(timeout=DEADLINE) for run in answered]
    assert {out.strip() for out, _ in outputs} == {only.id}
    assert all(run.returncode == 0 for run in answered)
    told = sum("already running as process " + only.id in err for _, err in outputs)
    assert told == 19
    stopped = run_cli("stop", "dev", "--wait", url=shared_url)
    assert stopped.returncode == 0, stopped.stderr
    for run in runs:  # the foreground one that ran it ends with it
        if run.returncode is None:
            run.communicate(timeout=DEADLINE)


def test_replace_stops_the_named_service_and_starts_the_command(
    tmp_path: Path, procs: Processes
) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    first = run_cli("run", "--background", "--name", "web", "--", "sleep", "300", url=url)
    assert first.returncode == 0, first.stderr
    again = run_cli(
        "run", "--background", "--name", "web", "--replace", "--", "sleep", "301", url=url
    )
    assert again.returncode == 0, again.stderr
    own_children(url, procs)
    old, new = named(url, "web")
    assert old.id == first.stdout.strip()
    assert old.is_terminal
    assert new.id == again.stdout.strip()
    assert new.state.value == "running"
    assert new.input.argv == ["sleep", "301"]
    assert run_cli("stop", "web", "--wait", url=url).returncode == 0


def test_up_converges_in_dependency_order_and_down_reverses_it(
    tmp_path: Path, procs: Processes
) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    service_file(tmp_path)
    ran = cli_in(tmp_path, url, "up")
    assert ran.returncode == 0, ran.stderr
    own_children(url, procs)
    assert [line.split(":")[0] for line in ran.stdout.splitlines()] == ["db", "web", "worker"]
    db, web, worker = (named(url, name)[-1] for name in ("db", "web", "worker"))
    assert db.ready_at_ms is not None
    assert web.ready_at_ms is not None
    assert web.created_at_ms >= db.ready_at_ms  # each dependency ready before its dependents
    assert worker.created_at_ms >= web.ready_at_ms
    assert db.port is not None
    assert web.port is not None
    assert db.port != web.port

    again = cli_in(tmp_path, url, "up")
    assert again.returncode == 0, again.stderr
    assert all("running as defined" in line for line in again.stdout.splitlines())
    assert [len(named(url, name)) for name in ("db", "web", "worker")] == [1, 1, 1]

    service_file(tmp_path, worker_sleep="2")  # an edited command: just that service restarts
    edited = cli_in(tmp_path, url, "up")
    assert edited.returncode == 0, edited.stderr
    own_children(url, procs)
    assert "worker: restarted (its definition changed)" in edited.stdout
    assert [len(named(url, name)) for name in ("db", "web", "worker")] == [1, 1, 2]
    assert named(url, "worker")[0].is_terminal

    restarted = cli_in(tmp_path, url, "restart", "web")  # just that one
    assert restarted.returncode == 0, restarted.stderr
    own_children(url, procs)
    assert restarted.stdout.startswith("web: restarted (")
    assert [len(named(url, name)) for name in ("db", "web", "worker")] == [1, 2, 2]

    down = cli_in(tmp_path, url, "down")
    assert down.returncode == 0, down.stderr
    assert [line.split(":")[0] for line in down.stdout.splitlines()] == ["worker", "web", "db"]
    ended = [named(url, name)[-1] for name in ("worker", "web", "db")]
    assert all(record.is_terminal for record in ended)
    finished = [record.finished_at_ms or 0 for record in ended]
    assert finished == sorted(finished)  # dependents stopped first


def test_a_dependency_that_never_gets_ready_stops_up(tmp_path: Path, procs: Processes) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    (tmp_path / "procledger.toml").write_text(
        '[services.db]\ncommand = "sleep 300"\nrestart = "never"\n'
        'ready = { file = "never-there", timeout = "0.5s" }\n'
        '[services.web]\ncommand = "sleep 300"\ndepends_on = ["db"]\n'
    )
    ran = cli_in(tmp_path, url, "up")
    own_children(url, procs)
    assert ran.returncode == 1
    assert ran.stderr.count("\n") == 1
    assert "db ended before it was ready" in ran.stderr
    assert named(url, "web") == []


def test_an_agent_after_a_reboot_like_crash_brings_up_services_back_once(
    tmp_path: Path, procs: Processes
) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    service_file(tmp_path)
    assert cli_in(tmp_path, url, "up").returncode == 0
    own_children(url, procs)
    agent = LiveAgent(url)
    status = agent.status()
    assert status is not None
    assert status["anchor_pid"] is not None
    before = {name: named(url, name)[-1] for name in ("db", "web", "worker")}
    agent.kill(status["anchor_pid"], "procledger.agent.anchor")  # the host goes down: all of it
    agent.kill(status["pid"])
    for record in before.values():
        assert record.os is not None
        psutil.Process(record.os.pid).kill()
        wait_until(lambda r=record: not _alive(r.os.pid), DEADLINE, "the child gone")

    agent.start()  # the host is up again
    for name, old in before.items():
        back = wait_until(lambda n=name: _running_again(url, n), DEADLINE, f"{name} brought back")
        assert back.attempt == 2
        assert back.attempt_of == old.id
    own_children(url, procs)
    assert [len(named(url, name)) for name in before] == [2, 2, 2]
    db, web = named(url, "db")[-1], named(url, "web")[-1]
    assert db.port == before["db"].port
    assert web.port == before["web"].port

    second = agent.status()  # an agent restart alone adopts what runs: nothing starts again
    assert second is not None
    agent.kill(second["pid"])
    agent.await_serving(other_than=second["pid"])
    assert [len(named(url, name)) for name in before] == [2, 2, 2]
    assert all(named(url, name)[-1].state.value == "running" for name in before)
    elsewhere = tmp_path / "elsewhere"  # no file here: down stops what up left desired
    elsewhere.mkdir()
    down = cli_in(elsewhere, url, "down")
    assert down.returncode == 0, down.stderr
    assert [line.split(":")[0] for line in down.stdout.splitlines()] == ["worker", "web", "db"]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _running_again(url: str, name: str) -> ProcessRecord | None:
    records = named(url, name)
    newest = records[-1] if records else None
    if newest is not None and newest.attempt == 2 and newest.state.value == "running":
        return newest
    return None


def test_up_json_and_show_by_name(tmp_path: Path, procs: Processes) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    service_file(tmp_path)
    ran = cli_in(tmp_path, url, "up", "worker", "--json")  # its dependencies come along
    own_children(url, procs)
    assert ran.returncode == 0, ran.stderr
    done = orjson.loads(ran.stdout)
    assert [each["name"] for each in done] == ["db", "web", "worker"]
    shown = run_cli("show", "web", "--json", url=url)
    assert shown.returncode == 0, shown.stderr
    assert orjson.loads(shown.stdout)["record"]["name"] == "web"
    assert cli_in(tmp_path, url, "down").returncode == 0


def test_a_service_on_a_named_port_restarts_on_it_after_serving_connections(
    tmp_path: Path, procs: Processes
) -> None:
    """The connections a server closed leave its port in TIME_WAIT; a server rebinds there
    (``SO_REUSEADDR``), so `--replace` on the same `--port` must not call it taken."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    (tmp_path / "server.py").write_text(SERVER)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    argv = ("run", "--background", "--wait-ready", "--name", "web", "--port", port)
    first = cli_in(tmp_path, url, *argv, "--", "python3", "server.py")
    assert first.returncode == 0, first.stderr
    own_children(url, procs)
    for _ in range(3):  # the server closes each connection first: TIME_WAIT on its side
        with socket.create_connection(("127.0.0.1", int(port)), timeout=10) as client:
            client.sendall(b"GET / HTTP/1.0\r\n\r\n")
            while client.recv(4096):
                pass
    again = cli_in(tmp_path, url, *argv, "--replace", "--", "python3", "server.py")
    assert again.returncode == 0, again.stderr
    own_children(url, procs)
    old, new = named(url, "web")
    assert old.is_terminal
    assert new.state.value == "running"
    assert new.port == int(port)
    assert run_cli("stop", "web", "--wait", url=url).returncode == 0


@pytest.mark.parametrize("command", ["up", "down", "restart"])
def test_a_service_not_in_the_file_is_a_usage_error_and_records_nothing(
    tmp_path: Path, command: str
) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    service_file(tmp_path)
    ran = cli_in(tmp_path, url, command, "cache")
    assert ran.returncode == 2
    assert ran.stderr.count("\n") == 1
    assert "no service 'cache' in procledger.toml (db, web, worker)" in ran.stderr
    assert not (tmp_path / "ledger.db").exists()
