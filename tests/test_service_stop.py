"""A stop of a service ends the service (docs/design.md §15.4, issue 28): whatever moment it
comes -- while an attempt runs, between two attempts, during the backoff, just before a spawn --
no attempt starts once the stop is on record, the attempt in progress is stopped, and
``procledger stop`` says the service ended. Real children throughout; every process a test
starts is killed by exact pid at its end (``procs``; host agents by the autouse fixture).

The moments a crash loop passes too fast to aim at are held open by a gate the test opens: the
service thread is paused after an attempt ended and before the next is registered, or after
the backoff and before the spawn, and the stop is made then.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

from _shared import Processes, is_dead, run_cli, wait_until
from procledger import (
    AlreadyTerminal,
    InvalidTransition,
    LeaseOwner,
    NotFound,
    ProcessLifecycleValidationError,
    ProcessRecord,
    ProcessRegistry,
    ProcessState,
    RestartMode,
    RestartPolicy,
    StopPolicy,
    Supervisor,
    TerminalReason,
)

ALWAYS_AT_ONCE = RestartPolicy(
    mode=RestartMode.always, max_restarts=1000, backoff_initial_s=0, backoff_max_s=0
)


@pytest.fixture
def supervisor(
    registry: ProcessRegistry, owner: LeaseOwner, tmp_path: Path
) -> Iterator[Supervisor]:
    made = Supervisor(
        registry, owner=owner, stop=StopPolicy(grace_s=5.0), output_dir=tmp_path / "output"
    )
    yield made
    made.shutdown(grace_s=1.0)


@pytest.fixture
def ledger(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/ledger.db"


class Gate:
    """Holds a thread at one point until the test opens it: ``reached`` once it is there."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.opened = threading.Event()

    def hold(self) -> None:
        self.reached.set()
        assert self.opened.wait(60), "the test never opened the gate"

    def wait_reached(self) -> None:
        assert self.reached.wait(60), "the service thread never reached the gate"


def exists(registry: ProcessRegistry, process_id: str) -> bool:
    try:
        registry.get(process_id)
    except NotFound:
        return False
    return True


def attempt_ids(registry: ProcessRegistry, first: str) -> list[str]:
    return [record.id for record in registry.attempts(first)]


def waits_for(path: Path, code: int) -> list[str]:
    """A child that runs until ``path`` exists, then exits with ``code``."""
    return ["sh", "-c", f'while [ ! -e "{path}" ]; do sleep 0.02; done; exit {code}']


# -- the service thread: a stop of the service on record is read before every attempt ----------


def test_a_service_stop_on_record_ends_it_when_the_running_attempt_ends(
    registry: ProcessRegistry, supervisor: Supervisor, tmp_path: Path
) -> None:
    """Only the service's stop is recorded (nothing asks the attempt to stop): the attempt
    runs to its end, and none follows it -- whoever reads the ledger sees the service over."""
    go = tmp_path / "go"
    handle = supervisor.start(waits_for(go, 1), restart=ALWAYS_AT_ONCE)
    first = handle.process_id
    wait_until(lambda: registry.get(first).state is ProcessState.running, what="it to run")
    stopped = registry.request_service_stop(first, "terminated")
    assert stopped.service_stop_requested == [TerminalReason.terminated]
    assert stopped.state is ProcessState.running  # not a lifecycle move
    go.touch()
    last = supervisor.wait(handle, timeout=30)
    assert (last.id, last.state, last.exit_code) == (first, ProcessState.exited, 1)
    assert not exists(registry, f"{first}.2")
    assert registry.await_end(first, timeout=5).id == first


def test_a_service_stop_on_record_during_the_backoff_ends_the_pending_attempt(
    registry: ProcessRegistry, supervisor: Supervisor
) -> None:
    """The next attempt waits out a 30 s backoff, ``starting``: a stop of the service (not of
    that attempt) ends it ``killed`` -- as asked -- without running it."""
    policy = RestartPolicy(mode=RestartMode.always, backoff_initial_s=30, backoff_max_s=30)
    handle = supervisor.start(["sh", "-c", "exit 1"], restart=policy)
    second = f"{handle.process_id}.2"
    wait_until(lambda: exists(registry, second), 30, "the second attempt to be registered")
    registry.request_service_stop(handle.process_id, "killed")
    last = supervisor.wait(handle, timeout=30)
    assert (last.id, last.state, last.reason) == (
        second,
        ProcessState.killed,
        TerminalReason.killed,
    )
    assert last.started_at_ms is None
    assert not exists(registry, f"{handle.process_id}.3")


def test_a_service_stop_made_just_before_a_spawn_starts_nothing(
    registry: ProcessRegistry, supervisor: Supervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backoff is over and the service thread is about to spawn the next attempt (held
    at its start slot): a stop of the service recorded now is read under the service's lock,
    before the spawn, and the attempt ends ``terminated`` without running."""
    gate = Gate()
    runner = supervisor._services
    slot: Callable[[], AbstractContextManager[None]] = runner._slot

    @contextmanager
    def held_slot() -> Iterator[None]:
        gate.hold()
        with slot():
            yield

    monkeypatch.setattr(runner, "_slot", held_slot)
    handle = supervisor.start(["sh", "-c", "exit 1"], restart=ALWAYS_AT_ONCE)
    gate.wait_reached()
    second = f"{handle.process_id}.2"
    assert registry.get(second).state is ProcessState.starting
    registry.request_service_stop(handle.process_id, "interrupted")
    gate.opened.set()
    last = supervisor.wait(handle, timeout=30)
    assert (last.id, last.state) == (second, ProcessState.terminated)
    assert last.started_at_ms is None
    assert [e.kind for e in registry.events(second)].count("started") == 0
    assert attempt_ids(registry, handle.process_id) == [handle.process_id, second]


def test_stop_between_two_attempts_ends_the_service(
    registry: ProcessRegistry,
    registry_url: str,
    supervisor: Supervisor,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The issue's miss: `procledger stop` while the newest attempt has ended and the next is
    not registered yet (the service thread held right there). It used to answer "already
    ended: exited" and the loop went on; now the stop is recorded for the service, the
    command says so, and the thread starts nothing when it goes on."""
    gate = Gate()
    runner = supervisor._services
    plan_after = runner._plan_after

    def held_plan(*args: Any) -> Any:
        gate.hold()
        return plan_after(*args)

    monkeypatch.setattr(runner, "_plan_after", held_plan)
    handle = supervisor.start(["sh", "-c", "exit 1"], restart=ALWAYS_AT_ONCE)
    first = handle.process_id
    gate.wait_reached()
    assert registry.get(first).state is ProcessState.exited
    assert not exists(registry, f"{first}.2")

    stopped = run_cli("stop", first, "--mode", "terminate", url=registry_url)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout == (
        f"service {first} stopped: no further attempt starts; its newest attempt {first} "
        "had ended: exited (exit 1)\n"
    )
    assert registry.get(first).service_stop_requested == [TerminalReason.terminated]
    gate.opened.set()
    assert supervisor.wait(handle, timeout=30).id == first
    assert not exists(registry, f"{first}.2")
    waited = run_cli("wait", first, "--until", "exit", "--timeout", "10s", url=registry_url)
    assert waited.returncode == 1, waited.stderr  # over (exit 1), not a timeout (124)


# -- `procledger stop` of a service run by the host agent ---------------------------------------
# The agent (and its anchor) are killed at the end of each test by the autouse fixture, by the
# pids the anchor's pid file names; killing the agent alone would have its anchor start another.


def shown_attempts(url: str, process_id: str) -> list[dict[str, Any]]:
    ran = run_cli("show", process_id, "--json", url=url)
    assert ran.returncode == 0, ran.stderr
    document = orjson.loads(ran.stdout)
    attempts: list[dict[str, Any]] = document.get("attempts") or [document["record"]]
    return attempts


def events_of(url: str, process_id: str) -> list[dict[str, Any]]:
    ran = run_cli("show", process_id, "--json", url=url)
    assert ran.returncode == 0, ran.stderr
    events: list[dict[str, Any]] = orjson.loads(ran.stdout)["events"]
    return events


def agent_children(url: str) -> int:
    ran = run_cli("agent", "status", "--json", url=url)
    assert ran.returncode == 0, ran.stderr
    children: int = orjson.loads(ran.stdout)["children"]
    return children


@pytest.mark.parametrize("by", ["first", "older attempt"])
def test_stop_of_a_crash_looping_service_by_any_attempt_id_ends_it(ledger: str, by: str) -> None:
    """`run --background --restart always -- sh -c 'exit 1'` with a 0.1 s backoff, stopped by
    its id or an earlier attempt's: exit 0, the service reported stopped, `wait` sees it over,
    the agent runs nothing of it any more, and no attempt registered after the stop ran."""
    ran = run_cli(
        "run", "--background", "--restart", "always", "--backoff-initial", "0.1s",
        "--backoff-max", "0.1s", "--max-restarts", "1000", "--", "sh", "-c", "exit 1", url=ledger,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    first = ran.stdout.strip()
    wait_until(lambda: len(shown_attempts(ledger, first)) >= 3, 30, "a third attempt")
    target = first if by == "first" else f"{first}.2"

    stopped = run_cli("stop", target, "--mode", "terminate", url=ledger)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.startswith(f"service {first} stopped: no further attempt starts; ")
    waited = run_cli("wait", first, "--until", "exit", "--timeout", "30s", url=ledger)
    assert waited.returncode == 1, waited.stderr  # ended (unsuccessfully), not 124
    wait_until(lambda: agent_children(ledger) == 0, 30, "the agent to hold nothing")

    (asked,) = [e for e in events_of(ledger, first) if e["kind"] == "service_stop_requested"]
    assert asked["payload"]["reason"] == "terminated"
    attempts = shown_attempts(ledger, first)
    assert all(a["state"] != "running" and a["state"] != "starting" for a in attempts)
    at = asked["occurred_at_ms"]
    # No attempt registered after the stop ever ran. At most one ran on past it: spawned after
    # its own last look at the record, as the stop was being written (its `started` write, and
    # so its `started_at_ms`, come after its spawn); none began after that one.
    assert all(a["started_at_ms"] is None for a in attempts if a["created_at_ms"] > at)
    assert len([a for a in attempts if (a["started_at_ms"] or 0) > at]) <= 1, attempts
    again = run_cli("stop", first, url=ledger)
    assert (again.returncode, "already ended" in again.stdout) == (0, True), again.stdout


def test_stop_of_a_service_stops_the_attempt_in_progress(ledger: str, procs: Processes) -> None:
    pidfile = procs.pidfile("attempt.pid")
    command = f'echo $$ > "{pidfile}.tmp" && mv "{pidfile}.tmp" "{pidfile}" && exec sleep 120'
    ran = run_cli(
        "run", "--background", "--restart", "always", "--backoff-initial", "0s",
        "--backoff-max", "0s", "--", "sh", "-c", command, url=ledger,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    first = ran.stdout.strip()
    child = procs.await_pid(pidfile)
    stopped = run_cli("stop", first, "--mode", "terminate", url=ledger)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout == (
        f"service {first} stopped: no further attempt starts; stop requested (terminated) "
        f"for its attempt {first}\n"
    )
    wait_until(lambda: is_dead(child), 30, "the attempt's child to be stopped")
    waited = run_cli("wait", first, "--until", "exit", "--timeout", "30s", url=ledger)
    assert waited.returncode == 1, waited.stderr
    (only,) = shown_attempts(ledger, first)
    assert (only["id"], only["state"], only["reason"]) == (first, "terminated", "terminated")


def test_stop_of_a_service_that_is_over_records_nothing(ledger: str) -> None:
    """A service given up (crash_loop) is over: `stop` says so, exits 0, records nothing."""
    ran = run_cli(
        "run", "--restart", "on-failure", "--max-restarts", "1", "--backoff-initial", "0s",
        "--backoff-max", "0s", "--", "sh", "-c", "exit 2", url=ledger,
    )  # fmt: skip
    assert ran.returncode == 2, ran.stderr
    first = orjson.loads(run_cli("ps", "--all", "--json", url=ledger).stdout)["records"][0]
    first_id = first["attempt_of"]
    before = events_of(ledger, first_id)
    stopped = run_cli("stop", first_id, url=ledger)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout == (
        f"service {first_id} already ended: its newest attempt {first_id}.2 exited (exit 2)\n"
    )
    assert events_of(ledger, first_id) == before


# -- an ended process refuses a stop request plainly ----------------------------------------------


def test_a_stop_request_of_an_ended_process_is_already_terminal(
    registry: ProcessRegistry, supervisor: Supervisor
) -> None:
    handle = supervisor.start(["sh", "-c", "exit 3"])
    ended: ProcessRecord = supervisor.wait(handle, timeout=30)
    with pytest.raises(AlreadyTerminal) as caught:
        registry.request_stop(handle.process_id, "terminated")
    assert isinstance(caught.value, InvalidTransition)  # callers of the general case still catch
    assert str(caught.value) == (
        f"process {handle.process_id!r} has already ended (exited): 'stop_requested' is refused"
    )
    assert registry.get(handle.process_id) == ended  # nothing written


def test_a_service_stop_is_refused_for_a_plain_process(
    registry: ProcessRegistry, supervisor: Supervisor
) -> None:
    handle = supervisor.start(["sh", "-c", "exit 0"])
    supervisor.wait(handle, timeout=30)
    with pytest.raises(ProcessLifecycleValidationError) as caught:
        registry.request_service_stop(handle.process_id, "terminated")
    assert caught.value.field == "restart"
