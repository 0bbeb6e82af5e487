"""Integration tests of execution (DESIGN §6.1) with real processes.

Each test states one rule of the contract and checks it through the public operations (and,
for the Supervisor's needs, ``OwnedChild``). Programs are finite (a broken implementation
fails a bound instead of hanging), every pid a test creates is killed by exact pid at teardown
(``procs``), and ``no_leaks`` checks descriptors, threads and children after every path.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from _shared import Processes, wait_until
from procledger.domain.errors import Interrupted, ProcledgerError, SpawnError, StdinError
from procledger.supervisor import os_seam
from procledger.supervisor.execution import (
    CapturedOutput,
    OwnedChild,
    StopPolicy,
    Streamed,
    run_captured,
    run_streaming,
)

from .conftest import StartCall, program

MALFORMED = b"ok line\n\xff\xfe not utf-8 \x00 nul\n\xc3\x28 no newline at end \x80"
KIB = 1024
MIB = 1024 * KIB


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def save(pid: str, path: Path) -> str:
    """Shell: write ``pid`` (``$!``: the last background job; ``$$``: the shell) atomically."""
    return f"echo {pid} > {path}.tmp && mv {path}.tmp {path}"


class Boom(Exception):
    pass


# --- results ---------------------------------------------------------------------------------


def test_captured_output_is_exact_bytes_and_nonzero_status_is_a_result() -> None:
    err = MALFORMED[::-1]
    result = run_captured(program("emit", MALFORMED.hex(), err.hex(), "3"))
    assert result == CapturedOutput(returncode=3, stdout=MALFORMED, stderr=err)


def test_a_child_killed_by_a_signal_has_a_negative_returncode() -> None:
    assert run_captured(sh("kill -TERM $$")).returncode == -signal.SIGTERM


def test_streaming_hands_raw_bytes_to_the_consumer_and_inherits_stderr(
    capfd: pytest.CaptureFixture[str],
) -> None:
    chunks: list[bytes] = []
    result = run_streaming(program("emit", MALFORMED.hex(), b"to stderr".hex(), "5"), chunks.append)
    assert result == Streamed(returncode=5)
    assert b"".join(chunks) == MALFORMED
    assert capfd.readouterr().err == "to stderr"


# --- stdin -----------------------------------------------------------------------------------


def test_absent_stdin_is_dev_null() -> None:
    assert run_captured(program("stdin-report")).stdout.split()[:2] == [b"devnull", b"0"]


def test_empty_stdin_is_a_closed_pipe() -> None:
    assert run_captured(program("stdin-report"), stdin=b"").stdout.split()[:2] == [b"pipe", b"0"]


def test_given_stdin_is_written_once_then_closed_and_str_is_utf8() -> None:
    text = "prompt: héllo\n"
    data = text.encode()
    report = run_captured(program("stdin-report"), stdin=text).stdout.split()
    assert report == [b"pipe", str(len(data)).encode(), hashlib.sha256(data).hexdigest().encode()]


def test_large_stdin_and_large_output_on_both_pipes_do_not_deadlock() -> None:
    data = os.urandom(256 * KIB)
    result = run_captured(program("echo-both", str(256 * KIB)), stdin=data)
    assert result.returncode == 0
    assert result.stdout == data
    assert result.stderr == bytes(range(256)) * KIB


# --- completion ------------------------------------------------------------------------------


def test_eof_is_not_exit() -> None:
    started = time.monotonic()
    result = run_captured(sh("exec 1>&- 2>&-; sleep 0.3; exit 7"))
    assert result.returncode == 7
    assert time.monotonic() - started >= 0.25


def test_output_a_descendant_writes_after_the_child_exited_is_collected() -> None:
    result = run_captured(sh("(sleep 0.2; echo late) & echo early; exit 0"))
    assert result == CapturedOutput(returncode=0, stdout=b"early\nlate\n", stderr=b"")


def test_normal_completion_leaves_detached_background_work_running(
    procs: Processes, tmp_path: Path
) -> None:
    pidfile = procs.pidfile("detached.pid")
    assert run_captured(program("detach", pidfile)).returncode == 0
    detached = procs.await_pid(pidfile)
    assert detached.is_running()
    assert detached.status() != psutil.STATUS_ZOMBIE


# --- failures --------------------------------------------------------------------------------


def test_child_closing_stdin_with_a_prompt_pending_raises_stdin_error(procs: Processes) -> None:
    pidfile = procs.pidfile("sleep.pid")
    started = time.monotonic()
    with pytest.raises(StdinError) as raised:
        run_captured(sh(f"sleep 30 & {save('$!', pidfile)}; exec 0<&-; wait"), stdin=b"x" * MIB)
    assert isinstance(raised.value.__cause__, BrokenPipeError)
    assert time.monotonic() - started < 2
    procs.assert_dead(procs.await_pid(pidfile, timeout=0))


def test_a_consumer_failure_while_a_prompt_write_is_blocked_is_reraised_as_is(
    procs: Processes,
) -> None:
    pidfile = procs.pidfile("sleep.pid")
    boom = Boom("consumer failed")
    calls: list[bytes] = []

    def consumer(chunk: bytes) -> None:
        calls.append(chunk)
        raise boom

    started = time.monotonic()
    with pytest.raises(Boom) as raised:
        run_streaming(
            sh(f"sleep 30 & {save('$!', pidfile)}; echo ready; wait"), consumer, stdin=b"x" * MIB
        )
    assert raised.value is boom
    assert len(calls) == 1
    assert time.monotonic() - started < 2
    procs.assert_dead(procs.await_pid(pidfile, timeout=0))


def test_a_read_failure_stops_the_tree_and_is_reraised(
    procs: Processes, monkeypatch: pytest.MonkeyPatch
) -> None:
    pidfile = procs.pidfile("sleep.pid")
    failure = OSError(5, "Input/output error")

    def failing_read(pipe: object) -> bytes:
        raise failure

    monkeypatch.setattr(os_seam, "read_available", failing_read)
    with pytest.raises(OSError, match="Input/output error") as raised:
        run_captured(sh(f"sleep 30 & {save('$!', pidfile)}; echo ready; wait"))
    assert raised.value is failure
    procs.assert_dead(procs.await_pid(pidfile, timeout=0))


def test_an_observed_interruption_takes_precedence_over_a_failure(procs: Processes) -> None:
    pidfile = procs.pidfile("sleep.pid")
    cancel = threading.Event()

    def consumer(chunk: bytes) -> None:
        cancel.set()
        raise Boom

    with pytest.raises(Interrupted) as raised:
        run_streaming(
            sh(f"sleep 30 & {save('$!', pidfile)}; echo ready; wait"), consumer, cancel=cancel
        )
    assert isinstance(raised.value.__cause__, Boom)
    procs.assert_dead(procs.await_pid(pidfile, timeout=0))


@pytest.mark.parametrize(
    ("argv", "cwd"),
    [(["/nonexistent/program", "arg"], None), (["true"], "/nonexistent/directory")],
    ids=["missing-program", "missing-cwd"],
)
def test_spawn_failure_names_the_command_and_never_calls_the_consumer(
    argv: list[str], cwd: str | None
) -> None:
    calls: list[bytes] = []
    with pytest.raises(SpawnError) as raised:
        run_streaming(argv, calls.append, cwd=cwd)
    assert os_seam.describe(argv) in str(raised.value)
    assert isinstance(raised.value, OSError | ProcledgerError)
    assert raised.value.errno is not None
    assert calls == []
    with pytest.raises(SpawnError):
        run_captured(argv, cwd=cwd)


# --- interruption ----------------------------------------------------------------------------


def test_cancel_while_a_descendant_holds_stdout_after_the_child_exited(
    procs: Processes, in_thread: StartCall
) -> None:
    holder_file, child_file = procs.pidfile("holder.pid"), procs.pidfile("child.pid")
    cancel = threading.Event()
    script = f"sleep 30 & {save('$!', holder_file)}; {save('$$', child_file)}"
    call = in_thread(lambda: run_captured(sh(script), cancel=cancel))
    holder, child = procs.await_pid(holder_file), procs.await_pid(child_file)
    wait_until(lambda: child.status() == psutil.STATUS_ZOMBIE, what="the child to exit")
    assert holder.is_running()
    cancelled = time.monotonic()
    cancel.set()
    with pytest.raises(Interrupted):
        call.result()
    assert time.monotonic() - cancelled < 2
    procs.assert_dead(holder)


def test_cancel_while_a_prompt_the_child_never_reads_is_blocked(
    procs: Processes, in_thread: StartCall
) -> None:
    pidfile = procs.pidfile("sleep.pid")
    cancel = threading.Event()
    argv = sh(f"sleep 30 & {save('$!', pidfile)}; wait")
    call = in_thread(lambda: run_captured(argv, stdin=b"x" * MIB, cancel=cancel))
    sleeper = procs.await_pid(pidfile)
    cancelled = time.monotonic()
    cancel.set()
    with pytest.raises(Interrupted):
        call.result()
    assert time.monotonic() - cancelled < 2
    procs.assert_dead(sleeper)


def test_cancel_set_before_the_call_spawns_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "spawned"
    cancel = threading.Event()
    cancel.set()
    calls: list[bytes] = []
    before = set(psutil.Process().children())  # e.g. a multiprocessing forkserver of another test
    with pytest.raises(Interrupted):
        run_streaming(sh(f"touch {marker}"), calls.append, cancel=cancel)
    with pytest.raises(Interrupted):
        run_captured(sh(f"touch {marker}"), cancel=cancel)
    assert not marker.exists()
    assert calls == []
    assert set(psutil.Process().children()) == before


def test_stop_policy_signals_in_order_then_kills_what_was_started_during_the_grace(
    procs: Processes, tmp_path: Path, in_thread: StartCall
) -> None:
    log, ready, escaped_file = (
        tmp_path / "signals.log",
        procs.pidfile("ready.pid"),
        procs.pidfile("escaped.pid"),
    )
    cancel = threading.Event()
    policy = StopPolicy(signals=(signal.SIGINT, signal.SIGTERM), grace_s=1.0)
    argv = program("trap-stop", log, ready, escaped_file)
    call = in_thread(lambda: run_captured(argv, stop=policy, cancel=cancel))
    child = procs.await_pid(ready)
    cancel.set()
    with pytest.raises(Interrupted):
        call.result()
    assert log.read_text() == "INT\nTERM\n"
    escaped = procs.await_pid(escaped_file, timeout=0)
    assert escaped.pid not in {c.pid for c in psutil.Process(os.getpid()).children(recursive=True)}
    procs.assert_dead(escaped)
    procs.assert_dead(child)


def test_cancel_is_observed_with_the_thread_exit_watcher_too(
    procs: Processes, in_thread: StartCall, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where pidfds are missing (old kernels, seccomp) a thread waits, without reaping."""
    if not hasattr(os_seam, "_thread_exit"):
        pytest.skip("the waitid watcher is the Linux fallback only")
    monkeypatch.setattr(os_seam, "_pidfd_exit", lambda pid: None)
    assert run_captured(sh("echo hi; exit 4")) == CapturedOutput(4, b"hi\n", b"")
    pidfile = procs.pidfile("holder.pid")
    cancel = threading.Event()
    call = in_thread(lambda: run_captured(sh(f"sleep 30 & {save('$!', pidfile)}"), cancel=cancel))
    holder = procs.await_pid(pidfile)
    cancel.set()
    with pytest.raises(Interrupted):
        call.result()
    procs.assert_dead(holder)


# --- the owned child, as the Supervisor uses it ----------------------------------------------


def test_stop_without_escalation_leaves_a_child_that_ignores_it_then_kill_now(
    procs: Processes,
) -> None:
    ready = procs.pidfile("ready.pid")
    with OwnedChild.spawn(program("ignore-int", ready), stdout=lambda chunk: None) as child:
        assert procs.await_pid(ready).pid == child.pid == child.pgid
        assert os.getpgid(child.pid) == child.pid != os.getpgrp()
        assert child.stop(StopPolicy((signal.SIGINT,), grace_s=0.2), escalate=False) is False
        assert child.returncode is None
        assert child.stop(StopPolicy((signal.SIGKILL,), grace_s=0)) is True
        assert child.wait() == -signal.SIGKILL
    assert child.returncode == -signal.SIGKILL
    assert child.stop() is True  # a reaped child: nothing is signalled


def test_stop_from_another_thread_ends_the_owners_wait_with_the_signal(
    procs: Processes, in_thread: StartCall
) -> None:
    ready = procs.pidfile("ready.pid")
    chunks: list[bytes] = []
    with OwnedChild.spawn(
        sh(f"echo hi; {save('$$', ready)}; exec sleep 30"),  # said before it is ready
        stdout=chunks.append,
    ) as child:
        procs.await_pid(ready)
        stopper = in_thread(lambda: child.stop(StopPolicy((signal.SIGTERM,), 5.0)))
        assert child.wait() == -signal.SIGTERM
        assert stopper.result() is True
    assert b"".join(chunks) == b"hi\n"


def test_stop_policy_validates_its_fields() -> None:
    with pytest.raises(ValueError, match="signals"):
        StopPolicy(signals=())
    with pytest.raises(ValueError, match="grace_s"):
        StopPolicy(grace_s=-1)
    assert StopPolicy(signals=(2,)).signals == (signal.SIGINT,)  # type: ignore[arg-type, unused-ignore]
