"""The Supervisor (docs/design.md §6.2) against real processes, on SQLite and PostgreSQL.

Every child writes its pid to a file the test names (``procs``), so teardown kills it by exact
pid; ``no_leaks`` (autouse) checks descriptors, threads and children after every test.
"""

from __future__ import annotations

import base64
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest

from _shared import Processes, is_dead, wait_until
from procledger import (
    AlreadyTerminal,
    InvalidTransition,
    LeaseOwner,
    LeaseTimings,
    NotFound,
    ProcessRegistry,
    ProcessState,
    ProcessStatus,
    RecoveryDisposition,
    SpawnError,
    SupervisorClosed,
    TerminalReason,
    open_registry,
)
from procledger.domain.notification import ProcessCompletionNotification
from procledger.supervisor import runs as runs_module
from procledger.supervisor.decide import event_ids
from procledger.supervisor.execution import StopPolicy
from procledger.supervisor.supervisor import StopMode, Supervisor

TERMINAL_KINDS = {"completed", "lost", "abandoned"}
HANDLE = re.compile(r"^[A-Za-z0-9_-]{22}$")


# -- fixtures -------------------------------------------------------------------------------------


# -- child programs -------------------------------------------------------------------------------


def sleeper(pidfile: Path, seconds: int = 60) -> list[str]:
    """A shell that records its pid (atomically) and becomes ``sleep`` (same pid)."""
    return ["sh", "-c", f'echo $$ > "{pidfile}.tmp" && mv "{pidfile}.tmp" "{pidfile}" && '
            f"exec sleep {seconds}"]  # fmt: skip


IGNORING = """
import os, signal, sys, time
signal.signal(getattr(signal, sys.argv[2]), signal.SIG_IGN)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(60)
"""


def ignoring(signame: str, pidfile: Path) -> list[str]:
    """A python child that ignores ``signame`` and says so (by writing its pid) when it does."""
    return [sys.executable, "-c", IGNORING, str(pidfile), signame]


READS_ITSELF = """
import sys, orjson
from procledger import open_registry
registry = open_registry(sys.argv[1])
record = registry.get(sys.argv[2])
kinds = [event.kind for event in registry.events(sys.argv[2])]
lease = registry.get_lease(sys.argv[2])
print(orjson.dumps({"state": record.state, "kinds": kinds, "leased": lease is not None}).decode())
registry.close()
"""


def kinds(registry: ProcessRegistry, process_id: str) -> list[str]:
    return [event.kind for event in registry.events(process_id)]


# -- start ----------------------------------------------------------------------------------------


def test_true_is_recorded_from_registration_to_exit(
    registry: ProcessRegistry, supervisor: Supervisor
) -> None:
    handle = supervisor.start(["true"])
    record = supervisor.wait(handle, timeout=30)
    assert (record.state, record.reason, record.exit_code) == (
        ProcessState.exited,
        TerminalReason.exited,
        0,
    )
    assert record.status is ProcessStatus.completed
    assert kinds(registry, handle.process_id) == [
        "registered",
        "first_started",
        "started",
        "output_captured",
        "completed",
    ]
    assert registry.get_lease(handle.process_id) is None  # released with the terminal
    assert registry.get(handle.process_id) == record


def test_a_non_zero_exit_is_a_result(supervisor: Supervisor) -> None:
    record = supervisor.wait(supervisor.start(["sh", "-c", "exit 7"]), timeout=30)
    assert (record.state, record.exit_code, record.status) == (
        ProcessState.exited,
        7,
        ProcessStatus.failed,
    )


@pytest.mark.parametrize("limit", [-1, 2**63])
def test_an_output_limit_the_ledger_cannot_hold_is_refused_before_registering(
    supervisor: Supervisor, registry: ProcessRegistry, limit: int
) -> None:
    # 2**63 once failed after the registration, leaving a record `starting` that nothing ran.
    with pytest.raises(ValueError, match="output_limit"):
        supervisor.start(["true"], output_limit=limit)
    assert registry.list_processes() == []


def test_starting_is_durable_before_the_child_runs(
    shared_url: str, registry: ProcessRegistry, supervisor: Supervisor
) -> None:
    """The child itself opens the ledger and finds its registration, first start and lease."""
    out = bytearray()
    process_id = f"reads-itself-{uuid.uuid4().hex[:6]}"
    handle = supervisor.start(
        [sys.executable, "-c", READS_ITSELF, shared_url, process_id],
        process_id=process_id,
        stdout=out.extend,
    )
    record = supervisor.wait(handle, timeout=60)
    assert record.exit_code == 0, out
    seen = orjson.loads(bytes(out))
    assert seen["kinds"][:2] == ["registered", "first_started"]
    assert seen["state"] in {"starting", "running"}
    assert seen["leased"] is True


def test_started_xor_backgrounded(
    registry: ProcessRegistry, supervisor: Supervisor, procs: Processes
) -> None:
    foreground = supervisor.start(["true"])
    background = supervisor.start(["true"], background=True)
    supervisor.wait(foreground, timeout=30)
    record = supervisor.wait(background, timeout=30)
    assert kinds(registry, foreground.process_id).count("started") == 1
    assert "backgrounded" not in kinds(registry, foreground.process_id)
    assert kinds(registry, background.process_id).count("backgrounded") == 1
    assert "started" not in kinds(registry, background.process_id)
    assert record.backgrounded is True


def test_handles_are_22_random_url_safe_characters(supervisor: Supervisor) -> None:
    handles = [supervisor.start(["true"]) for _ in range(5)]
    for handle in handles:
        supervisor.wait(handle, timeout=30)
        assert HANDLE.match(handle.handle)
        assert len(base64.urlsafe_b64decode(handle.handle + "==")) == 16
        assert handle.process_id not in handle.handle
    assert len({h.handle for h in handles}) == 5


def test_spawn_failure_records_failed_and_raises(
    registry: ProcessRegistry, make_supervisor: Callable[..., Supervisor]
) -> None:
    sent: list[ProcessCompletionNotification] = []
    supervisor = make_supervisor(notifier=_Recorder(registry, sent))
    session, loop = uuid.uuid4(), uuid.uuid4()
    with pytest.raises(SpawnError, match="no-such-program"):
        supervisor.start(
            ["/no/such/dir/no-such-program"], process_id="doomed", session_id=session, loop_id=loop
        )
    record = registry.get("doomed")
    assert (record.state, record.reason) == (ProcessState.failed, TerminalReason.failed)
    assert record.diagnostic is not None
    assert "no-such-program" in record.diagnostic
    assert registry.get_lease("doomed") is None
    assert [(n.state, n.reason) for n in sent] == [(ProcessState.failed, TerminalReason.failed)]


def test_a_finished_process_is_not_started_again(
    registry: ProcessRegistry, supervisor: Supervisor
) -> None:
    supervisor.wait(supervisor.start(["true"], process_id="once"), timeout=30)
    with pytest.raises(AlreadyTerminal):
        supervisor.start(["true"], process_id="once")
    assert kinds(registry, "once").count("started") == 1


def test_environment_values_are_stored_only_for_rerunnable(
    registry: ProcessRegistry, supervisor: Supervisor
) -> None:
    env = {"PATH": os.environ["PATH"], "SECRET": "s3cret"}
    bound = supervisor.start(["true"], env=env)
    rerun = supervisor.start(["true"], env=env, disposition=RecoveryDisposition.rerunnable)
    supervisor.wait(bound, timeout=30)
    supervisor.wait(rerun, timeout=30)
    ref = registry.get(bound.process_id).env_ref
    assert ref is not None
    assert ref == registry.get(rerun.process_id).env_ref
    assert registry.load_env(ref) == env  # stored once, for the rerunnable one


def test_owner_bound_environment_is_never_stored(
    registry: ProcessRegistry, supervisor: Supervisor
) -> None:
    env = {"PATH": os.environ["PATH"], "ONLY_HERE": uuid.uuid4().hex}
    record = supervisor.wait(supervisor.start(["true"], env=env), timeout=30)
    assert record.env_ref is not None
    with pytest.raises(NotFound):
        registry.load_env(record.env_ref)


def test_lifecycle_writes_carry_the_ids_derived_at_registration(
    registry: ProcessRegistry, supervisor: Supervisor
) -> None:
    handle = supervisor.start(["true"])
    record = supervisor.wait(handle, timeout=30)
    ids = event_ids(record.id, record.registration_hash)
    by_kind = {event.kind: event.event_id for event in registry.events(record.id)}
    assert by_kind["started"] == ids.started
    assert by_kind["completed"] == ids.completed
    assert event_ids(record.id, record.registration_hash) == ids  # stable


def test_the_lease_is_renewed_while_the_process_runs(
    registry: ProcessRegistry, make_supervisor: Callable[..., Supervisor], procs: Processes
) -> None:
    supervisor = make_supervisor(timings=LeaseTimings(ttl_ms=600, renew_ms=150))
    pidfile = procs.pidfile("renewed")
    handle = supervisor.start(sleeper(pidfile, 60))
    procs.await_pid(pidfile)
    first = registry.get_lease(handle.process_id)
    assert first is not None
    wait_until(
        lambda: _expiry(registry, handle.process_id) > first.expires_at_ms + 600,
        what="three renewals",
    )
    lease = registry.get_lease(handle.process_id)
    assert lease is not None
    assert (lease.lease_token, lease.fencing_token) == (first.lease_token, first.fencing_token)
    record = supervisor.stop(handle, StopMode.kill)
    assert record.state is ProcessState.killed  # the terminal write still held the lease


def _expiry(registry: ProcessRegistry, process_id: str) -> int:
    lease = registry.get_lease(process_id)
    return 0 if lease is None else lease.expires_at_ms


# -- stop -----------------------------------------------------------------------------------------


def test_interrupt_records_the_request_and_the_sigint(
    registry: ProcessRegistry, supervisor: Supervisor, procs: Processes
) -> None:
    pidfile = procs.pidfile("sleep")
    handle = supervisor.start(sleeper(pidfile))
    child = procs.await_pid(pidfile)
    record = supervisor.stop(handle, StopMode.interrupt, grace_s=10)
    assert (record.state, record.reason) == (ProcessState.interrupted, TerminalReason.interrupted)
    assert record.stop_requested == [TerminalReason.interrupted]
    assert record.status is ProcessStatus.cancelled
    assert kinds(registry, handle.process_id)[-3:] == [
        "stop_requested",
        "output_captured",
        "completed",
    ]
    procs.assert_dead(child)


def test_interrupt_never_escalates(
    registry: ProcessRegistry, supervisor: Supervisor, procs: Processes
) -> None:
    ready = procs.pidfile("ignores-int")
    handle = supervisor.start(ignoring("SIGINT", ready))
    child = procs.await_pid(ready)
    started = time.monotonic()
    record = supervisor.stop(handle, "interrupt", grace_s=0.5)
    assert time.monotonic() - started >= 0.45
    assert record.state is ProcessState.running  # it ignored SIGINT and nobody escalated
    assert record.stop_requested == [TerminalReason.interrupted]
    assert child.is_running()
    assert registry.get_lease(handle.process_id) is not None
    record = supervisor.stop(handle, "kill")
    assert (record.state, record.reason) == (ProcessState.killed, TerminalReason.killed)
    assert record.stop_requested == [TerminalReason.interrupted, TerminalReason.killed]


def test_terminate_sends_sigterm(supervisor: Supervisor, procs: Processes) -> None:
    pidfile = procs.pidfile("sleep")
    handle = supervisor.start(sleeper(pidfile))
    procs.await_pid(pidfile)
    record = supervisor.stop(handle, StopMode.terminate, grace_s=10)
    assert (record.state, record.reason) == (ProcessState.terminated, TerminalReason.terminated)
    assert record.stop_requested == [TerminalReason.terminated]


def test_terminate_kills_once_the_grace_has_passed(
    supervisor: Supervisor, procs: Processes
) -> None:
    ready = procs.pidfile("ignores-term")
    handle = supervisor.start(ignoring("SIGTERM", ready))
    child = procs.await_pid(ready)
    started = time.monotonic()
    record = supervisor.stop(handle, StopMode.terminate, grace_s=0.5)
    assert time.monotonic() - started >= 0.45
    assert (record.state, record.reason) == (ProcessState.killed, TerminalReason.killed)
    assert record.stop_requested == [TerminalReason.terminated]
    assert record.status is ProcessStatus.cancelled
    procs.assert_dead(child)


def test_kill_is_immediate(supervisor: Supervisor, procs: Processes) -> None:
    ready = procs.pidfile("ignores-term")
    handle = supervisor.start(ignoring("SIGTERM", ready))
    procs.await_pid(ready)
    started = time.monotonic()
    record = supervisor.stop(handle, StopMode.kill, grace_s=30)
    assert time.monotonic() - started < 10  # far below the grace it was given
    assert (record.state, record.reason) == (ProcessState.killed, TerminalReason.killed)
    assert record.stop_requested == [TerminalReason.killed]


def test_stopping_a_finished_process_signals_nothing(
    registry: ProcessRegistry,
    supervisor: Supervisor,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handle = supervisor.start(["sh", "-c", "exit 3"])
    finished = supervisor.wait(handle, timeout=30)
    signalled: list[tuple[str, int, int]] = []
    real_killpg, real_kill = os.killpg, os.kill
    monkeypatch.setattr(os, "killpg", lambda g, s: signalled.append(("killpg", g, s)))
    monkeypatch.setattr(os, "kill", lambda p, s: signalled.append(("kill", p, s)))
    try:
        for mode in StopMode:
            assert supervisor.stop(handle, mode) == finished
    finally:
        monkeypatch.setattr(os, "killpg", real_killpg)
        monkeypatch.setattr(os, "kill", real_kill)
    assert signalled == []
    assert registry.get(handle.process_id) == finished  # no stop_requested appended
    assert kinds(registry, handle.process_id)[-1] == "completed"


def test_unknown_and_foreign_handles_are_not_found(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    ours, theirs = make_supervisor(), make_supervisor()
    handle = theirs.start(["true"])
    theirs.wait(handle, timeout=30)
    for unknown in (handle, handle.handle, "A" * 22):
        with pytest.raises(NotFound):
            ours.stop(unknown, StopMode.kill)
        with pytest.raises(NotFound):
            ours.wait(unknown)


def test_a_stop_requested_elsewhere_is_carried_out_within_a_second(
    shared_url: str, supervisor: Supervisor, procs: Processes
) -> None:
    pidfile = procs.pidfile("sleep")
    handle = supervisor.start(sleeper(pidfile))
    procs.await_pid(pidfile)
    elsewhere = open_registry(shared_url)  # e.g. `procledger stop` in another terminal
    try:
        requested = time.monotonic()
        elsewhere.request_stop(handle.process_id, TerminalReason.terminated)
        record = supervisor.wait(handle, timeout=20)
        noticed_within = time.monotonic() - requested
    finally:
        elsewhere.close()
    assert (record.state, record.reason) == (ProcessState.terminated, TerminalReason.terminated)
    assert noticed_within < 5  # the contract's 1 s, with room for a loaded machine


def test_wait_times_out(supervisor: Supervisor, procs: Processes) -> None:
    pidfile = procs.pidfile("sleep")
    handle = supervisor.start(sleeper(pidfile))
    procs.await_pid(pidfile)
    with pytest.raises(TimeoutError):
        supervisor.wait(handle, timeout=0.1)
    assert supervisor.stop(handle, StopMode.kill).state is ProcessState.killed


# -- exactly one terminal -------------------------------------------------------------------------


class _Recorder:
    """A notifier that records each notification with what the ledger said at that moment."""

    def __init__(
        self, registry: ProcessRegistry, sent: list[ProcessCompletionNotification]
    ) -> None:
        self.registry = registry
        self.sent = sent
        self.seen: list[tuple[bool, bool]] = []  # (lease released, terminal recorded)
        self.process_id: str | None = None

    def notify_process_completion(self, notification: ProcessCompletionNotification) -> None:
        if self.process_id is not None:
            lease = self.registry.get_lease(self.process_id)
            record = self.registry.get(self.process_id)
            self.seen.append((lease is None, record.state.is_terminal))
        self.sent.append(notification)


@pytest.mark.parametrize("program", ["sleep", "exits-now"])
def test_racing_terminalizations_record_one_terminal(
    shared_url: str,
    registry: ProcessRegistry,
    make_supervisor: Callable[..., Supervisor],
    procs: Processes,
    program: str,
) -> None:
    """Exit, three stop modes, a stop requested elsewhere, a shutdown and two waits race."""
    for round_ in range(3):
        pidfile = procs.pidfile(f"race-{round_}")
        argv = sleeper(pidfile) if program == "sleep" else ["sh", "-c", "exit 5"]
        _race_round(shared_url, registry, make_supervisor, argv)


def _race_round(
    shared_url: str,
    registry: ProcessRegistry,
    make_supervisor: Callable[..., Supervisor],
    argv: list[str],
) -> None:
    sent: list[ProcessCompletionNotification] = []
    notifier = _Recorder(registry, sent)
    supervisor = make_supervisor(notifier=notifier, stop=StopPolicy(grace_s=0.3))
    handle = supervisor.start(argv, session_id=uuid.uuid4(), loop_id=uuid.uuid4())
    notifier.process_id = handle.process_id
    elsewhere = open_registry(shared_url)
    try:
        errors = _race(
            [
                lambda: supervisor.stop(handle, StopMode.kill),
                lambda: supervisor.stop(handle, StopMode.terminate, 0.3),
                lambda: supervisor.stop(handle, StopMode.interrupt, 0.3),
                lambda: supervisor.shutdown(0.3),
                lambda: elsewhere.request_stop(handle.process_id, TerminalReason.killed),
                lambda: supervisor.wait(handle, timeout=30),
                lambda: supervisor.wait(handle, timeout=30),
                lambda: supervisor.stop(handle, StopMode.kill),
            ]
        )
    finally:
        elsewhere.close()
    assert errors == []
    record = supervisor.wait(handle, timeout=30)
    log = kinds(registry, handle.process_id)
    assert sum(kind in TERMINAL_KINDS for kind in log) == 1, log
    assert log[-1] == "completed"
    assert len(sent) == 1
    assert (sent[0].state, sent[0].reason) == (record.state, record.reason)
    assert notifier.seen == [(True, True)]  # released with the terminal, before notifying
    lease_row = _lease_row(registry, handle.process_id)
    assert (lease_row["fencing_token"], lease_row["released"]) == (1, 1)


def _race(actions: list[Callable[[], object]]) -> list[BaseException]:
    """Run every action at once (a barrier releases them together); the unexpected errors."""
    barrier = threading.Barrier(len(actions))
    errors: list[BaseException] = []

    def racer(action: Callable[[], object]) -> None:
        barrier.wait()
        try:
            action()
        except (SupervisorClosed, InvalidTransition):
            pass  # shut down already, or the terminal was recorded first: both fine
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=racer, args=(action,)) for action in actions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return errors


def _lease_row(registry: ProcessRegistry, process_id: str) -> Any:
    store = registry._store
    with store.read() as tx:
        return tx.execute(
            f"SELECT fencing_token, released FROM {store.table('leases')} WHERE process_id=?",
            (process_id,),
        ).one()


# -- shutdown -------------------------------------------------------------------------------------


def test_shutdown_terminates_every_tree_and_closes(
    registry: ProcessRegistry, supervisor: Supervisor, procs: Processes
) -> None:
    handles, children = [], []
    for index in range(3):
        pidfile = procs.pidfile(f"sleep-{index}")
        handles.append(supervisor.start(sleeper(pidfile)))
        children.append(procs.await_pid(pidfile))
    stubborn = procs.pidfile("stubborn")
    handles.append(supervisor.start(ignoring("SIGTERM", stubborn)))
    children.append(procs.await_pid(stubborn))
    started = time.monotonic()
    supervisor.shutdown(grace_s=0.5)
    assert time.monotonic() - started < 10  # concurrently: one grace, not four
    states = [registry.get(h.process_id) for h in handles]
    assert [(r.state, r.reason) for r in states] == [
        *[(ProcessState.terminated, TerminalReason.runner_shutdown)] * 3,
        (ProcessState.killed, TerminalReason.runner_shutdown),
    ]
    assert all(registry.get_lease(h.process_id) is None for h in handles)
    for child in children:
        procs.assert_dead(child)
    with pytest.raises(SupervisorClosed):
        supervisor.start(["true"])


# -- restore --------------------------------------------------------------------------------------

SUPERVISOR_PROCESS = """
import os, sys, threading
import orjson
from procledger import LeaseOwner, open_registry
from procledger.supervisor.supervisor import Supervisor

url, owner_id, out, pidfile, session_id, loop_id = sys.argv[1:7]
registry = open_registry(url)
supervisor = Supervisor(registry, owner=LeaseOwner.local_process(owner_id))
script = f'echo $$ > "{pidfile}.tmp" && mv "{pidfile}.tmp" "{pidfile}" && exec sleep 60'
handle = supervisor.start(["sh", "-c", script], session_id=session_id, loop_id=loop_id)
with open(out + ".tmp", "wb") as f:
    f.write(orjson.dumps({"handle": handle.handle, "process_id": handle.process_id}))
os.rename(out + ".tmp", out)
threading.Event().wait(120)
"""


@pytest.mark.parametrize("keep_orphans", [False, True], ids=["stop-orphan", "keep-orphan"])
def test_restore_after_the_supervisor_was_killed(
    shared_url: str,
    registry: ProcessRegistry,
    procs: Processes,
    tmp_path: Path,
    keep_orphans: bool,
) -> None:
    from procledger.notifications import Notifier

    owner_id = f"restorable-{uuid.uuid4().hex[:8]}"
    session_id, loop_id = uuid.uuid4(), uuid.uuid4()
    out, pidfile = tmp_path / "started.json", procs.pidfile("orphan")
    import subprocess

    host = subprocess.Popen(
        [
            sys.executable,
            "-c",
            SUPERVISOR_PROCESS,
            shared_url,
            owner_id,
            str(out),
            str(pidfile),
            str(session_id),
            str(loop_id),
        ]
    )
    procs.add(host.pid)
    wait_until(out.exists, 60, "the supervisor process to start its child")
    started = orjson.loads(out.read_bytes())
    orphan = procs.await_pid(pidfile)
    assert registry.get(started["process_id"]).state is ProcessState.running

    host.send_signal(signal.SIGKILL)  # mid-run: nothing recorded the end
    host.wait(30)

    notifier = Notifier(registry, session_id)
    inbox = notifier.add_loop(loop_id)
    with Supervisor(registry, owner=LeaseOwner.local_process(owner_id), notifier=notifier) as sup:
        restored = sup.restore(keep_orphans=keep_orphans)
        again = sup.restore(keep_orphans=keep_orphans)
    assert [r.id for r in restored] == [started["process_id"]]
    assert again == []
    record = registry.get(started["process_id"])
    assert (record.state, record.reason) == (
        ProcessState.lost_on_restore,
        TerminalReason.lost_on_restore,
    )
    assert record.status is ProcessStatus.abandoned
    assert registry.get_lease(record.id) is None
    assert record.os is not None
    assert record.os.pid == orphan.pid
    assert record.diagnostic is not None
    assert f"OS pid {orphan.pid}" in record.diagnostic
    if keep_orphans:  # left running, and the record says so
        assert orphan.is_running()
        assert orphan.status() != psutil.STATUS_ZOMBIE
        assert "left running" in record.diagnostic
    else:  # its tree was stopped, and the record says how
        assert is_dead(orphan)
        assert "restore stopped orphaned child" in record.diagnostic
        assert "SIGTERM" in record.diagnostic
    (notification,) = inbox.pending()
    row = registry.handle_row(record.id)
    assert row is not None
    assert notification.command_id == event_ids(record.id, record.registration_hash).command_id
    assert notification.command_id == row.command_id
    assert notification.process_handle == started["handle"]
    assert (notification.state, notification.reason) == (
        ProcessState.lost_on_restore,
        TerminalReason.lost_on_restore,
    )
    assert [n.command_id for n in notifier.undelivered(loop_id)] == [notification.command_id]


def test_restore_leaves_a_live_holder_alone(
    registry: ProcessRegistry, owner: LeaseOwner, procs: Processes
) -> None:
    pidfile = procs.pidfile("held")
    with Supervisor(registry, owner=owner) as running:
        handle = running.start(sleeper(pidfile))
        procs.await_pid(pidfile)
        same_owner = LeaseOwner.local_process(owner.owner_id)  # another incarnation, alive
        with Supervisor(registry, owner=same_owner) as restorer:
            assert restorer.restore() == []
        assert running.restore() == []  # its own running process is not lost either
        assert registry.get(handle.process_id).state is ProcessState.running
        assert running.stop(handle, StopMode.kill).state is ProcessState.killed


def test_restore_takes_only_this_owners_processes(
    registry: ProcessRegistry, procs: Processes
) -> None:
    """A released lease of another owner's process is not this owner's to restore."""
    stranger = LeaseOwner(owner_id="stranger", incarnation_id="gone")
    registry.register(_external_command("strangers"))
    claimed = registry.claim_lease("strangers", stranger, 60_000)
    registry.record_first_started("strangers", stranger, registry.now_ms())
    registry.release_lease(claimed.lease)  # type: ignore[union-attr]
    mine = LeaseOwner(owner_id="me", incarnation_id="dead")
    registry.register(_external_command("mine"))
    registry.record_first_started("mine", mine, registry.now_ms())  # never leased: lapsed
    with Supervisor(registry, owner=LeaseOwner.local_process("me")) as restorer:
        restored = restorer.restore()
    assert [r.id for r in restored] == ["mine"]
    assert registry.get("strangers").state is ProcessState.starting


def _external_command(process_id: str) -> Any:
    from procledger import ProcessInput, ProcessRegistration
    from procledger.domain.registration import Originator, env_ref_for

    return ProcessRegistration(
        id=process_id,
        input=ProcessInput.command(["sleep", "60"]),
        disposition=RecoveryDisposition.owner_bound,
        originator=Originator.host(),
        env_ref=env_ref_for({}),
    )


def test_a_lost_lease_stops_the_tree_and_writes_nothing(shared_url: str, procs: Processes) -> None:
    """Another owner took the expired lease and recorded the end: the tree is killed, and the
    supervisor writes no terminal of its own (the new holder owns the process now)."""
    now = [1_000_000]
    registry = open_registry(shared_url, clock=lambda: now[0])
    try:
        timings = LeaseTimings(ttl_ms=3_000, renew_ms=200)
        with Supervisor(registry, owner=LeaseOwner.local_process("slow"), timings=timings) as sup:
            pidfile = procs.pidfile("sleep")
            handle = sup.start(sleeper(pidfile))
            child = procs.await_pid(pidfile)
            now[0] += 60_000  # the lease expires (a suspended machine, a stalled store...)
            thief = LeaseOwner(owner_id="thief", incarnation_id="1")
            taken = registry.claim_lease(handle.process_id, thief, 60_000)
            lease = taken.lease  # type: ignore[union-attr]
            lost = registry.record_lost(handle.process_id, diagnostic="taken over", lease=lease)
            wait_until(lambda: is_dead(child), 20, "the next renewal to fail and kill the tree")
            assert sup.wait(handle, timeout=20) == lost
        log = kinds(registry, handle.process_id)
        assert sum(kind in TERMINAL_KINDS for kind in log) == 1
        assert log[-1] == "lost"
    finally:
        registry.close()


def test_a_long_finished_run_shrinks_and_its_handle_still_answers(
    supervisor: Supervisor, registry: ProcessRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A supervisor keeps only the newest finished runs whole (a harness that supervises for
    weeks must not keep every run it started); an older handle still answers from the ledger:
    ``wait`` and ``stop`` give its terminal record, ``returncode`` its status, and nothing is
    signalled or recorded for it."""
    monkeypatch.setattr(runs_module, "FINISHED_KEPT", 2)
    first = supervisor.start([sys.executable, "-c", "raise SystemExit(3)"])
    finished = supervisor.wait(first)
    for _ in range(3):
        supervisor.wait(supervisor.start(["true"]))
    assert len(supervisor._table._runs) == 2  # the newest two, whole
    assert supervisor.wait(first) == finished
    assert supervisor.wait(first.handle, timeout=0) == finished
    assert supervisor.wait_ready(first) == finished
    assert supervisor.returncode(first) == 3
    assert supervisor.stop(first, "kill") == finished
    supervisor.request_stop(first, "terminated")
    with pytest.raises(ValueError, match="not 'exited'"):
        supervisor.request_stop(first, "exited")
    assert registry.get(first.process_id) == finished  # no stop was recorded
    with pytest.raises(NotFound):
        supervisor.wait("no-such-handle")
