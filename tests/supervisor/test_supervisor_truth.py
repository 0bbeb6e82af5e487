"""The record tells the whole truth about the process (issue 14): the child's OS facts, the
signal that ended it, what it reads on stdin, which environment was stored, the tree a stop
leaves behind (with this process a child subreaper), and the orphans ``restore`` finds."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import psutil
import pytest

from _shared import Processes, end_process, wait_until
from procledger import (
    LeaseOwner,
    NotFound,
    ProcessRegistry,
    ProcessState,
    ProcessStatus,
    RecoveryDisposition,
    TerminalReason,
    open_registry,
)
from procledger.adapters.liveness import read_process_start
from procledger.application.outbox import this_host_id
from procledger.domain.records import OsFacts
from procledger.domain.registration import (
    Originator,
    ProcessInput,
    ProcessRegistration,
    env_ref_for,
)
from procledger.supervisor import orphans, os_seam
from procledger.supervisor.execution import StopPolicy
from procledger.supervisor.subreaper import is_child_subreaper
from procledger.supervisor.supervisor import Supervisor


@pytest.fixture
def registry_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/ledger.db"


def _sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def _save_pid(path: Path) -> str:
    return f'echo $$ > "{path}.tmp" && mv "{path}.tmp" "{path}"'


# -- OS facts --------------------------------------------------------------------------------


@pytest.mark.parametrize("background", [False, True])
def test_the_record_carries_the_childs_os_facts(
    registry: ProcessRegistry, owner: LeaseOwner, procs: Processes, background: bool
) -> None:
    pidfile = procs.pidfile("child")
    with Supervisor(registry, owner=owner, stop=StopPolicy(grace_s=2.0)) as sup:
        handle = sup.start(_sh(f"{_save_pid(pidfile)} && exec sleep 60"), background=background)
        child = procs.await_pid(pidfile)
        record = registry.get(handle.process_id)
        assert record.os == OsFacts(
            pid=child.pid,
            pgid=child.pid,  # it leads its own process group
            start_time=int(read_process_start(child.pid) or -1),
            host_id=this_host_id() or "",
        )
        assert record.os_pid == child.pid
        assert orphans.find_live_child(record) == child.pid
        sup.stop(handle, "kill")


# -- signal deaths ---------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGPIPE, signal.SIGKILL])
def test_a_signal_nobody_sent_is_signaled_not_a_cancellation(
    registry: ProcessRegistry, owner: LeaseOwner, sig: signal.Signals
) -> None:
    with Supervisor(registry, owner=owner) as sup:
        handle = sup.start(_sh(f"kill -{sig.name.removeprefix('SIG')} $$"))
        record = sup.wait(handle, timeout=30)
    assert (record.state, record.reason, record.exit_code) == (
        ProcessState.signaled,
        TerminalReason.signaled,
        None,
    )
    assert record.signal == sig
    assert record.status is ProcessStatus.failed
    assert sup.returncode(handle) == -sig


def test_a_requested_stop_keeps_its_state_and_names_the_signal(
    registry: ProcessRegistry, owner: LeaseOwner, procs: Processes
) -> None:
    pidfile = procs.pidfile("child")
    with Supervisor(registry, owner=owner) as sup:
        handle = sup.start(_sh(f"{_save_pid(pidfile)} && exec sleep 60"))
        procs.await_pid(pidfile)
        record = sup.stop(handle, "terminate", grace_s=5.0)
    assert (record.state, record.reason, record.signal) == (
        ProcessState.terminated,
        TerminalReason.terminated,
        signal.SIGTERM,
    )
    assert record.survivors == []


# -- stdin -----------------------------------------------------------------------------------


def _cat(sup: Supervisor, **kwargs: object) -> bytes:
    out = bytearray()
    handle = sup.start(["cat"], stdout=out.extend, **kwargs)  # type: ignore[arg-type]
    record = sup.wait(handle, timeout=30)
    assert record.exit_code == 0
    return bytes(out)


def test_stdin_is_null_by_default_a_file_or_bytes_when_asked(
    registry: ProcessRegistry, owner: LeaseOwner, tmp_path: Path
) -> None:
    source = tmp_path / "input.txt"
    source.write_bytes(b"from a file\n")
    with Supervisor(registry, owner=owner) as sup:
        assert _cat(sup) == b""  # /dev/null: EOF at once
        assert _cat(sup, stdin=source) == b"from a file\n"
        assert _cat(sup, stdin=b"given bytes") == b"given bytes"
        with pytest.raises(TypeError, match="stdin must be"):
            sup.start(["cat"], stdin="some text")  # type: ignore[arg-type]
        with pytest.raises(FileNotFoundError):
            sup.start(["cat"], stdin=tmp_path / "missing")


def test_stdin_inherit_passes_this_processs_stdin(
    registry: ProcessRegistry, owner: LeaseOwner
) -> None:
    read_end, write_end = os.pipe()
    saved = os.dup(0)
    out = bytearray()
    try:
        with Supervisor(registry, owner=owner) as sup:
            os.dup2(read_end, 0)
            try:
                handle = sup.start(["cat"], stdout=out.extend, stdin="inherit")
            finally:
                os.dup2(saved, 0)
                os.close(read_end)
            os.write(write_end, b"piped in\n")
            os.close(write_end)
            write_end = -1
            assert sup.wait(handle, timeout=30).exit_code == 0
    finally:
        os.close(saved)
        if write_end >= 0:
            os.close(write_end)
    assert bytes(out) == b"piped in\n"


# -- environment -----------------------------------------------------------------------------


def test_a_rerunnable_process_without_env_stores_no_environment(
    registry: ProcessRegistry, owner: LeaseOwner
) -> None:
    with Supervisor(registry, owner=owner) as sup:
        implicit = sup.start(["true"], disposition=RecoveryDisposition.rerunnable)
        explicit = sup.start(["true"], disposition="rerunnable", env={"ONLY": "this"})
        sup.wait(implicit, timeout=30)
        sup.wait(explicit, timeout=30)
    record = registry.get(implicit.process_id)
    assert record.env_ref is not None  # the hash of what it inherited ...
    with pytest.raises(NotFound):
        registry.load_env(record.env_ref)  # ... and no values: os.environ is never copied
    stored = registry.get(explicit.process_id).env_ref
    assert stored is not None
    assert registry.load_env(stored) == {"ONLY": "this"}


# -- tree stop with a child subreaper --------------------------------------------------------

ESCAPES = """
dir="$1"
save='echo $$ > "$0/$1.tmp" && mv "$0/$1.tmp" "$0/$1"; exec sleep 600'
setsid sh -c "$save" "$dir" setsid &
(sh -c "$save" "$dir" double &)
nohup sh -c "$save" "$dir" nohup >/dev/null 2>&1 &
setsid sh -c '(sh -c "$2" "$0" daemon &)' "$dir" x "$save"
exec sleep 600
"""
ESCAPED = ("setsid", "double", "nohup", "daemon")


def test_setsid_double_fork_and_nohup_leave_nothing_in_200_of_200_runs(
    owner: LeaseOwner, procs: Processes, tmp_path: Path
) -> None:
    registry = open_registry("memory://")
    script = tmp_path / "escapes.sh"
    script.write_text(ESCAPES)
    deadline = time.monotonic() + 240
    try:
        with Supervisor(registry, owner=owner, subreaper=True) as sup:
            assert is_child_subreaper()
            for run in range(200):
                assert time.monotonic() < deadline, f"200 runs took too long (at {run})"
                folder = tmp_path / f"run{run}"
                folder.mkdir()
                files = [procs.pidfile(f"run{run}/{name}") for name in ESCAPED]
                handle = sup.start(["sh", str(script), str(folder)])
                escaped = [procs.await_pid(path) for path in files]
                record = sup.stop(handle, "kill")
                assert record.state is ProcessState.killed
                assert record.survivors == []
                alive = [p.pid for p in escaped if p.is_running()]  # zombies too: reaped
                assert alive == [], f"run {run}: left {alive}"
        assert not is_child_subreaper()  # the mark is gone with its last supervisor
    finally:
        registry.close()


# -- orphans ---------------------------------------------------------------------------------


def _registered_orphan(registry: ProcessRegistry, pid: int, start_time: int) -> str:
    """A process whose recorded child is ``pid``, started by an owner that is gone."""
    process_id = f"orphan-{uuid.uuid4().hex[:8]}"
    registry.register(
        ProcessRegistration(
            id=process_id,
            input=ProcessInput.command(["sleep", "60"], "/"),
            disposition=RecoveryDisposition.owner_bound,
            originator=Originator.host(),
            env_ref=env_ref_for({}),
        )
    )
    gone = LeaseOwner.local_process("gone-supervisor")
    claimed = registry.claim_lease(process_id, gone, 60_000)
    registry.record_first_started(process_id, gone, registry.now_ms())
    facts = OsFacts(pid=pid, pgid=pid, start_time=start_time, host_id=this_host_id() or "")
    registry.record_started(process_id, registry.now_ms(), os=facts)
    registry.release_lease(claimed.lease)  # type: ignore[union-attr]
    return process_id


def test_find_live_child_checks_start_time_host_and_zombies(registry: ProcessRegistry) -> None:
    child = subprocess.Popen(["sleep", "60"], process_group=0)
    try:
        start = int(read_process_start(child.pid) or -1)
        live = registry.get(_registered_orphan(registry, child.pid, start))
        assert orphans.find_live_child(live) == child.pid
        reused = registry.get(_registered_orphan(registry, child.pid, start + 1))
        assert orphans.find_live_child(reused) is None  # another process under that pid
        elsewhere = live.model_copy(
            update={"os": live.os.model_copy(update={"host_id": "other:1"})}  # type: ignore[union-attr]
        )
        assert orphans.find_live_child(elsewhere) is None
        child.kill()
        wait_until(lambda: os_seam.proc_stat(child.pid)[0] == "Z", 10, "a zombie")  # type: ignore[index]
        assert orphans.find_live_child(live) is None  # exited, not yet reaped: dead
    finally:
        end_process(child)


def test_stop_orphan_stops_the_tree_and_records_the_signal(registry: ProcessRegistry) -> None:
    child = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], process_group=0)
    try:
        wait_until(lambda: psutil.Process(child.pid).children(), 10, "the grandchild")
        grandchild = psutil.Process(child.pid).children()[0]
        start = int(read_process_start(child.pid) or -1)
        record = registry.get(_registered_orphan(registry, child.pid, start))
        stopped = orphans.stop_orphan(registry, record, "terminate", 5.0)
        assert (stopped.state, stopped.reason, stopped.signal) == (
            ProcessState.terminated,
            TerminalReason.terminated,
            signal.SIGTERM,
        )
        assert registry.get_lease(record.id) is None
        assert not grandchild.is_running() or grandchild.status() == psutil.STATUS_ZOMBIE
        assert [e.kind for e in registry.events(record.id)][-2:] == [
            "stop_requested",
            "completed",
        ]
    finally:
        end_process(child)


def test_stdin_from_a_descriptor_the_caller_feeds(
    registry: ProcessRegistry, owner: LeaseOwner
) -> None:
    """How the CLI gives a terminal's input to a child without handing it the terminal."""
    read_end, write_end = os.pipe()
    out = bytearray()
    try:
        with Supervisor(registry, owner=owner) as sup:
            handle = sup.start(["cat"], stdout=out.extend, stdin=read_end)
            os.close(read_end)
            read_end = -1
            os.write(write_end, b"typed later\n")
            os.close(write_end)
            write_end = -1
            assert sup.wait(handle, timeout=30).exit_code == 0
            with pytest.raises(TypeError, match="stdin must be"):
                sup.start(["cat"], stdin=-1)
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
    assert bytes(out) == b"typed later\n"
