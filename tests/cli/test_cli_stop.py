"""``procledger stop`` tells the truth and ``procledger abandon`` settles what nobody owns
(docs/design.md §8): stop succeeds only when a live owner will carry it out or when it stopped the
tree itself; otherwise it records nothing, exits 1 and names ``abandon``."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable

import orjson
import psutil

from _shared import Processes, is_dead, run_cli, wait_until
from procledger import (
    Originator,
    ProcessInput,
    ProcessRegistration,
    RecoveryDisposition,
    open_registry,
)
from procledger.domain.registration import env_ref_for

from .conftest import Terminal, sleeper, supervise_sleeper


def kinds(url: str, process_id: str) -> list[str]:
    shown = run_cli("show", process_id, "--json", url=url)
    assert shown.returncode == 0, shown.stderr
    return [event["kind"] for event in orjson.loads(shown.stdout)["events"]]


def record(url: str, process_id: str) -> dict:
    shown = run_cli("show", process_id, "--json", url=url)
    assert shown.returncode == 0, shown.stderr
    return orjson.loads(shown.stdout)["record"]


def one_line_failure(ran: subprocess.CompletedProcess[str]) -> None:
    assert ran.returncode == 1, (ran.stdout, ran.stderr)
    assert ran.stderr.count("\n") == 1, ran.stderr
    assert "Traceback" not in ran.stderr


def orphaned(url: str, procs: Processes) -> tuple[str, psutil.Process, psutil.Process]:
    """A background run whose host agent and its anchor were both SIGKILLed (the anchor
    first, else it would start the agent again): its id, the dead agent and the child that
    lives on, re-parented to init."""
    pidfile = procs.pidfile("orphan")
    ran = run_cli("run", "--background", "--json", "--", *sleeper(pidfile, 120), url=url)
    assert ran.returncode == 0, ran.stderr
    started = orjson.loads(ran.stdout)
    supervisor = procs.add(started["first_started"]["owner"]["liveness"]["pid"])
    anchor = procs.add(supervisor.ppid())
    child = procs.await_pid(pidfile)
    for process in (anchor, supervisor):
        process.send_signal(signal.SIGKILL)
        wait_until(lambda p=process: is_dead(p), what=f"pid {process.pid} to die")
    return started["id"], supervisor, child


def test_stop_with_a_live_owner_is_requested_and_carried_out(
    ledger: str, terminal: Callable[..., Terminal], procs: Processes
) -> None:
    term, child = supervise_sleeper(terminal, procs, ledger)
    listed = orjson.loads(run_cli("ps", "--json", url=ledger).stdout)["records"]
    (process_id,) = [r["id"] for r in listed]
    stopped = run_cli("stop", process_id[:12], "--mode", "terminate", "--json", url=ledger)
    assert stopped.returncode == 0, stopped.stderr
    assert orjson.loads(stopped.stdout)["stop_requested"] == ["terminated"]
    assert term.wait() == 130
    wait_until(lambda: is_dead(child), what="the child to end")


def test_stop_of_an_orphan_stops_its_tree_here_and_records_it(
    ledger: str, procs: Processes
) -> None:
    process_id, _, child = orphaned(ledger, procs)
    stopped = run_cli("stop", process_id, "--mode", "kill", url=ledger)
    assert stopped.returncode == 0, stopped.stderr
    assert "here" in stopped.stdout
    wait_until(lambda: is_dead(child), what="the orphan to be stopped")
    final = record(ledger, process_id)
    assert final["state"] == "killed"
    assert final["status"] == "cancelled"
    assert_salvaged(final)


def assert_salvaged(final: dict) -> None:
    """The terminal written for a dead supervisor's run carries what its capture left."""
    output = final["output"]
    assert "supervisor died" in output["stopped"]
    assert output["limit"] is None  # not in the ledger: unknown, not guessed
    assert output["stdout"]["written"] in (0, len("ready\n"))  # the sleeper's one line, if out


def test_stop_with_nobody_to_carry_it_out_records_nothing_and_exits_1(
    ledger: str, procs: Processes
) -> None:
    process_id, _, child = orphaned(ledger, procs)
    child.send_signal(signal.SIGKILL)
    wait_until(lambda: is_dead(child), what="the child to die")
    before = kinds(ledger, process_id)
    ran = run_cli("stop", process_id, "--mode", "kill", url=ledger)
    one_line_failure(ran)
    assert f"procledger abandon {process_id}" in ran.stderr
    assert kinds(ledger, process_id) == before  # nothing recorded
    assert record(ledger, process_id)["state"] == "running"

    abandoned = run_cli("abandon", process_id, "--reason", "the host lost power", url=ledger)
    assert abandoned.returncode == 0, abandoned.stderr
    final = record(ledger, process_id)
    assert (final["state"], final["reason"], final["status"]) == (
        "abandoned",
        "abandon_requested",
        "abandoned",
    )
    assert "the host lost power" in final["diagnostic"]
    assert_salvaged(final)
    again = run_cli("stop", process_id, url=ledger)
    assert (again.returncode, "already ended" in again.stdout) == (0, True)


def test_a_process_registered_but_never_started_can_be_abandoned(ledger: str) -> None:
    registry = open_registry(ledger)
    try:
        registry.register(
            ProcessRegistration(
                id="never-started",
                input=ProcessInput.command(["true"], cwd="/"),
                disposition=RecoveryDisposition.owner_bound,
                originator=Originator.host(),
                env_ref=env_ref_for({}),
            )
        )
    finally:
        registry.close()
    one_line_failure(run_cli("stop", "never-started", url=ledger))
    assert kinds(ledger, "never-started") == ["registered"]
    ran = run_cli("abandon", "never-started", "--json", url=ledger)
    assert ran.returncode == 0, ran.stderr
    assert orjson.loads(ran.stdout)["state"] == "abandoned"


def test_abandon_is_refused_while_a_live_owner_holds_it(
    ledger: str, terminal: Callable[..., Terminal], procs: Processes
) -> None:
    term, _ = supervise_sleeper(terminal, procs, ledger)
    (process_id,) = [
        r["id"] for r in orjson.loads(run_cli("ps", "--json", url=ledger).stdout)["records"]
    ]
    before = kinds(ledger, process_id)
    ran = run_cli("abandon", process_id, url=ledger)
    one_line_failure(ran)
    assert "procledger stop" in ran.stderr
    assert kinds(ledger, process_id) == before
    term.ctrl_c()
    assert term.wait() == 130


def test_abandon_is_refused_while_the_orphaned_child_runs(ledger: str, procs: Processes) -> None:
    process_id, _, child = orphaned(ledger, procs)
    ran = run_cli("abandon", process_id, url=ledger)
    one_line_failure(ran)
    assert str(child.pid) in ran.stderr
    assert record(ledger, process_id)["state"] == "running"


def test_a_sweep_that_abandons_an_orphan_stops_its_child_and_says_so(
    ledger: str, procs: Processes
) -> None:
    # It once recorded `abandoned/owner_dead` and left the child running, unmentioned; `stop`
    # then said "already ended" and nothing would ever stop it.
    process_id, _, child = orphaned(ledger, procs)
    swept = run_cli("sweep", url=ledger)
    assert swept.returncode == 0, swept.stderr
    assert process_id in swept.stdout
    assert is_dead(child)
    final = record(ledger, process_id)
    assert (final["state"], final["reason"]) == ("abandoned", "owner_dead")
    assert f"sweep stopped orphaned child OS pid {child.pid}" in final["diagnostic"]


def test_waiting_on_a_process_whose_supervisor_is_gone_says_so(
    ledger: str, terminal: Callable[..., Terminal], procs: Processes
) -> None:
    # `wait --until exit` and `logs -f` on an orphan once waited forever without a word.
    process_id, _, child = orphaned(ledger, procs)
    waited = run_cli("wait", process_id, "--until", "exit", "--timeout", "0.5s", url=ledger)
    assert waited.returncode == 124, waited.stderr
    assert "has no live supervisor" in waited.stderr
    assert f"procledger abandon {process_id}" in waited.stderr
    assert "Traceback" not in waited.stderr
    following = terminal("--url", ledger, "logs", process_id, "-f")
    following.expect("has no live supervisor")
    following.ctrl_c()
    assert following.wait() == 130
    assert not is_dead(child)  # a hint only: nothing was stopped or recorded
    assert record(ledger, process_id)["state"] == "running"
    term, _ = supervise_sleeper(terminal, procs, ledger)  # a live one gets no such hint
    listed = orjson.loads(run_cli("ps", "--json", url=ledger).stdout)["records"]
    live = next(r["id"] for r in listed if r["id"] != process_id)
    waited = run_cli("wait", live, "--until", "exit", "--timeout", "0.2s", url=ledger)
    assert waited.returncode == 124
    assert "no live supervisor" not in waited.stderr
    term.ctrl_c()
    assert term.wait() == 130
