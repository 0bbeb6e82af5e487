"""A real host agent for end-to-end tests (docs/design.md §18): started through the CLI, asked
over its socket, killed by exact pid, its ledger read through the registry.

Every process a test makes is cleaned up by exact pid: the agent's tree by the autouse fixture
of ``tests/conftest.py`` (its anchor's pid file), and each child that could outlive that tree
(one re-parented to init once the anchor died) by the test, through ``Processes``.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psutil

from _shared import child_env, run_cli, wait_until
from procledger import ProcessRecord, ProcessRegistry, open_registry
from procledger.adapters.output_files import folder_for, output_root
from procledger.adapters.sql.location import locate, store_key
from procledger.agent.launch import ask, ledger_key
from procledger.agent.places import AgentPlaces
from procledger.domain.errors import AgentSocketError
from procledger.supervisor.decide import event_ids
from procledger.supervisor.minting import new_process_id

DEADLINE = 30.0
"""Seconds before a wait fails the test: a fail-fast net, never a synchronisation."""

TERMINAL_KINDS = frozenset({"completed", "lost", "abandoned"})
"""The event kinds that end a process."""

SLEEPER = 'echo $$ > "$1.tmp" && mv "$1.tmp" "$1" && echo ready && exec sleep 300'
"""``sh -c SLEEPER sh PIDFILE``: records its pid, says ``ready``, becomes ``sleep`` (same pid)."""


def sleeper(pidfile: Path) -> list[str]:
    return ["sh", "-c", SLEEPER, "sh", str(pidfile)]


class LiveAgent:
    """The agent of ``url``'s ledger on this host, as a test drives it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.places = AgentPlaces.of(ledger_key(url))

    # -- the CLI ----------------------------------------------------------------------------

    def cli(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """``procledger --url URL ARGS...`` (``env`` added to the test's environment)."""
        environment = child_env(**env)
        environment.pop("PROCLEDGER_URL", None)
        return run_cli(*args, url=self.url, env=environment)

    def start(self, **env: str) -> dict[str, Any]:
        """``procledger agent start --json``: the agent's status."""
        ran = self.cli("agent", "start", "--json", **env)
        assert ran.returncode == 0, ran.stderr
        status: dict[str, Any] = orjson.loads(ran.stdout)
        return status

    def run_background(self, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
        """``procledger run --background -- ARGV...``, completed."""
        return self.cli("run", "--background", "--", *argv, **env)

    # -- the socket -------------------------------------------------------------------------

    def status(self) -> dict[str, Any] | None:
        """The agent's ``status`` reply, or ``None`` while none answers."""
        try:
            answer: dict[str, Any] = ask(self.places, {"op": "status"}, timeout=10.0)
        except AgentSocketError:
            return None
        return answer

    def await_serving(self, other_than: int | None = None) -> dict[str, Any]:
        """The status of an agent that answers and is not ``other_than`` (the one just
        killed): its takeover is over once it answers ``status``."""

        def serving() -> dict[str, Any] | None:
            found = self.status()
            return found if found is not None and found["pid"] != other_than else None

        found = wait_until(serving, DEADLINE, f"an agent other than {other_than}")
        assert found is not None
        return found

    def start_child(self, argv: list[str], cwd: Path, **env: str) -> str:
        """Ask the agent to start ``argv`` (what ``run --background`` asks); its process id."""
        process_id = new_process_id(int(time.time() * 1000))
        order = {
            "op": "start",
            "argv": argv,
            "process_id": process_id,
            "cwd": str(cwd),
            "env": child_env(**env),
        }
        answer = ask(self.places, order, timeout=DEADLINE)
        assert answer == {"process_id": process_id}, answer
        return process_id

    # -- processes --------------------------------------------------------------------------

    def kill(self, pid: int, what: str = "procledger.agent") -> None:
        """SIGKILL ``pid`` -- only if it runs ``what`` -- and wait until it is gone (reaped by
        its parent, or a zombie whose parent is gone too)."""
        process = psutil.Process(pid)
        assert what in " ".join(process.cmdline()), process.cmdline()
        process.send_signal(signal.SIGKILL)  # psutil refuses a pid reused since the lookup
        wait_until(lambda: _gone(process), DEADLINE, f"pid {pid} to be gone")

    # -- the ledger -------------------------------------------------------------------------

    @contextlib.contextmanager
    def ledger(self) -> Iterator[ProcessRegistry]:
        registry = open_registry(self.url)
        try:
            yield registry
        finally:
            registry.close()

    def record(self, process_id: str) -> ProcessRecord:
        with self.ledger() as registry:
            return registry.get(process_id)

    def event_kinds(self, process_id: str) -> list[str]:
        with self.ledger() as registry:
            return [str(event.kind) for event in registry.events(process_id)]

    def await_terminal(self, process_id: str, timeout: float = DEADLINE) -> ProcessRecord:
        with self.ledger() as registry:
            return registry.await_terminal(process_id, timeout=timeout)

    def output_folder(self, process_id: str) -> Path:
        key = store_key(locate(self.url))
        assert key is not None
        return folder_for(output_root(), key, process_id)

    def logs(self, process_id: str, *options: str) -> str:
        """``procledger logs ID [OPTIONS]``'s output."""
        ran = self.cli("logs", process_id, *options)
        assert ran.returncode == 0, ran.stderr
        return str(ran.stdout)

    def logs_of_each(self, process_ids: list[str], folder: Path, *options: str) -> list[str]:
        """``procledger logs ID [OPTIONS]``'s output for each id: the CLI's ``main`` run once
        per id in one interpreter (twenty interpreters would cost the drill ~15 s)."""
        folder.mkdir()
        argv = [sys.executable, "-c", LOGS_OF_EACH, self.url, str(folder), " ".join(options)]
        ran = subprocess.run(
            [*argv, *process_ids], capture_output=True, text=True, timeout=120,
            env=child_env(), check=False,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        return [(folder / process_id).read_text() for process_id in process_ids]


LOGS_OF_EACH = """
import io, sys
from procledger.cli import main
url, folder, options, *ids = sys.argv[1:]
for process_id in ids:
    with open(f"{folder}/{process_id}", "wb") as out:
        sys.stdout = io.TextIOWrapper(out, write_through=True)
        try:
            main(["--url", url, "logs", process_id, *options.split()])
        except SystemExit as done:
            if done.code:
                sys.exit(f"logs {process_id} exited {done.code}")
        finally:
            sys.stdout.flush()
            sys.stdout.detach()
            sys.stdout = sys.__stdout__
"""


def run_marker(record: ProcessRecord) -> str:
    return event_ids(record.id, record.registration_hash).run_marker


def _gone(process: psutil.Process) -> bool:
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def ppid_of(pid: int) -> int:
    """The parent of ``pid`` now (``/proc/<pid>/stat`` field 4)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2 :].split()[1])
