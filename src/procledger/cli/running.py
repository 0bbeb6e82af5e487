"""`procledger run`: supervise one command in the foreground, or -- with ``--background`` --
hand it to the ledger's host agent (docs/design.md §8, §18).

The CLI's owner and notification session are in ``procledger.cli._owner``; `restore` uses them
too, for runs whose `procledger` died.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from procledger import NameTaken, ProcessState, ProcledgerError, SpawnError, TerminalReason
from procledger.cli._app import dump, open_ledger
from procledger.cli._format import ending
from procledger.cli._owner import cli_notifier, cli_owner
from procledger.cli.dispatch import fail
from procledger.cli.lines import (
    EXIT_FAILURE,
    EXIT_STOPPED,
    PROG,
    one_line,
    spawn_exit_code,
    warn,
    write_json,
)
from procledger.cli.naming import answer_taken, stop_named
from procledger.cli.run_options import RunOptions, StdinSource
from procledger.cli.values import UsageError

if TYPE_CHECKING:
    from procledger import ProcessHandle, ProcessRecord, ProcessRegistry, StopPolicy, Supervisor
    from procledger.cli.terminal_relay import TerminalRelay

ChildStdin = Literal["inherit", "null"] | Path | int
"""What a foreground child reads, as ``Supervisor.start`` takes it."""

_HINT_AFTER_S = 0.5
"""How long the first Ctrl-C's stop may take before the hint about the second one is shown."""


def _stop_policy(options: RunOptions) -> StopPolicy:
    """Ctrl-C's ladder: SIGINT, then --stop-signal, then SIGKILL, --grace apart."""
    from procledger import StopPolicy

    return StopPolicy((signal.SIGINT, options.stop_signal), options.grace_s)


def run_foreground(url: str | None, options: RunOptions) -> int:
    """Supervise in this process until the terminal is recorded; the exit code is the
    command's (docs/design.md §8)."""
    relayed = wants_terminal(options)
    with open_ledger(url) as registry, _child_stdin(options.stdin, relayed) as stdin:
        if options.replace and options.name is not None:
            stop_named(registry, options.name, options.grace_s)
        try:
            record, exit_code = _supervise(registry, options, stdin=stdin, relayed=relayed)
        except SpawnError as exc:  # recorded `failed`; exit as a shell would
            fail("run", exc, spawn_exit_code(exc.errno))
        except NameTaken as taken:
            held = dump(registry.get(taken.process_id)) if options.as_json else None
            return answer_taken(taken, held)
    if options.as_json:
        write_json(dump(record))
    if exit_code and _tell_how_it_ended(record, as_json=options.as_json):
        warn(f"process {record.id} {how_it_ended(record)}")
    return exit_code


def wants_terminal(options: RunOptions) -> bool:
    """Whether the command runs on a pseudo-terminal relayed to ours (docs/design.md §20.1):
    as ``--pty``/``--no-pty`` say, else when a person is at this one -- stdin and stdout both
    terminals -- and stdout is not kept for ``--json``'s record."""
    if options.pty is not None:
        return options.pty
    return options.stdin == "inherit" and not options.as_json and os.isatty(0) and os.isatty(1)


def _tell_how_it_ended(record: ProcessRecord, *, as_json: bool) -> bool:
    """Whether a run that did not succeed says how it ended on stderr: always when procledger
    itself ended it ``failed`` (a readiness deadline: the exit code, 1, says nothing of why),
    otherwise only to a person at a terminal, as a shell reports a job -- and never for SIGPIPE,
    a pipeline's quiet end (``| head``), which no shell reports either."""
    if record.state is ProcessState.failed:
        return True
    return not as_json and sys.stderr.isatty() and record.signal != signal.SIGPIPE


def how_it_ended(record: ProcessRecord) -> str:
    """The state and why, as the ledger says them: ``exited (exit 3)``,
    ``failed/ready_timeout: not ready within 1 s: ...``, ``killed (signal 9)``,
    ``terminated/runner_shutdown (signal 15)``. A ``failed`` record names no signal (the one
    that then stopped the tree is not how it ended) but its diagnostic."""
    gave_up = f"; the service gave up ({record.gave_up})" if record.gave_up else ""
    return _state_and_why(record) + gave_up


def _state_and_why(record: ProcessRecord) -> str:
    if record.state is ProcessState.exited:
        return ending(record)
    text = record.state.value
    if record.reason is not None and record.reason.value != record.state.value:
        text += f"/{record.reason.value}"
    if record.state is ProcessState.failed:
        return text + (f": {record.diagnostic}" if record.diagnostic else "")
    return text + (f" (signal {record.signal})" if record.signal else "")


@contextmanager
def _child_stdin(stdin: StdinSource, relayed: bool) -> Iterator[ChildStdin]:
    """What the child reads: its pseudo-terminal when ``relayed`` (``null`` to ``start``,
    whose terminal is then the child's stdin); else a terminal is passed on through a pipe,
    since a child in its own process group would be stopped reading the terminal itself
    (cli/terminal_input.py)."""
    if stdin == "pipe":  # parse_stdin allows it with --background only
        raise UsageError("--stdin pipe is a background run's (send writes to it)", "--stdin")
    if relayed or stdin != "inherit":
        yield "null" if relayed else cast("ChildStdin", stdin)
        return
    from procledger.cli.terminal_input import terminal_stdin

    with terminal_stdin() as fed:
        yield stdin if fed is None else fed


class _RunSignals:
    """What Ctrl-C, SIGTERM and SIGHUP do to a supervised run, from the main thread's handlers.

    Handlers only start threads: a registry write inside a handler could re-enter a write the
    main thread was in the middle of. First Ctrl-C: stop with the run's policy (SIGINT, then
    --stop-signal after the grace, then SIGKILL). Second: kill now. SIGTERM/SIGHUP: shut the
    supervisor down (terminal `runner_shutdown`)."""

    def __init__(
        self, supervisor: Supervisor, grace_s: float, leaving: Callable[[], None] | None = None
    ) -> None:
        self._supervisor = supervisor
        self._grace_s = grace_s
        self._leaving = leaving  # gives our terminal back at once (a relayed run's)
        self._handle: ProcessHandle | None = None
        self._presses = 0
        self._threads: list[threading.Thread] = []
        self.shutdown_signal: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_interrupt)
        for signum in (signal.SIGTERM, signal.SIGHUP):
            self._previous[signum] = signal.signal(signum, self._on_shutdown)

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        for thread in self._threads:
            thread.join()

    def attach(self, handle: ProcessHandle) -> None:
        """The run started: carry out the presses that came while it was starting."""
        self._handle = handle
        for press in range(min(self._presses, 2)):
            self._request(press)
        if self.shutdown_signal is not None:
            self._background(self._supervisor.shutdown, self._grace_s)

    def _on_interrupt(self, signum: int, frame: Any) -> None:
        self._presses += 1
        if self._handle is not None and self._presses <= 2:
            self._request(self._presses - 1)

    def _on_shutdown(self, signum: int, frame: Any) -> None:
        first = self.shutdown_signal is None
        self.shutdown_signal = signum
        if self._leaving is not None:
            self._leaving()
        if first and self._handle is not None:
            self._background(self._supervisor.shutdown, self._grace_s)

    def _request(self, press: int) -> None:
        reason = TerminalReason.interrupted if press == 0 else TerminalReason.killed
        self._background(self._supervisor.request_stop, self._handle, reason)
        if press == 0:
            self._background(self._hint_if_still_running)

    def _hint_if_still_running(self) -> None:
        """A child that ignores SIGINT keeps running through the grace: say how to hurry."""
        if self._handle is None:
            return
        try:
            self._supervisor.wait(self._handle, timeout=_HINT_AFTER_S)
        except TimeoutError:
            if self._presses < 2:
                os.write(2, "stopping… press Ctrl-C again to kill\n".encode())

    def _background(self, target: Callable[..., object], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name="procledger-cli-stop")
        self._threads.append(thread)
        thread.start()


def _run_exit_code(record: ProcessRecord, returncode: int | None, shutdown: int | None) -> int:
    """`run`'s exit status: the child's own code, 1 when it failed once started, 130 when
    stopped on request, 128 + signal when a signal nobody asked for ended it (docs/design.md
    §8)."""
    if record.state is ProcessState.exited:
        return record.exit_code or 0
    if record.state is ProcessState.failed:  # a readiness deadline, a consumer that failed:
        return EXIT_FAILURE  # the signal that then stopped the tree is not how it ended
    if record.reason is TerminalReason.runner_shutdown:
        return 128 + (shutdown or signal.SIGTERM)
    stopped = (ProcessState.interrupted, ProcessState.terminated, ProcessState.killed)
    if record.state in stopped and record.stop_requested:
        return EXIT_STOPPED
    if record.signal is not None:
        return 128 + record.signal
    if returncode is not None and returncode < 0:
        return 128 - returncode
    return EXIT_FAILURE


def _supervise(
    registry: ProcessRegistry, options: RunOptions, *, stdin: ChildStdin, relayed: bool
) -> tuple[ProcessRecord, int]:
    """Run the command under a fresh CLI supervisor until its terminal is recorded -- on a
    pseudo-terminal relayed to ours when ``relayed`` (``cli.terminal_relay``)."""
    from procledger import Supervisor

    policy = _stop_policy(options)
    owner = cli_owner()
    notifier, loop_id = cli_notifier(registry, owner)
    supervisor = Supervisor(
        registry, owner=owner, notifier=notifier, stop=policy, notice=_notice, subreaper=True
    )
    relay = _relay(supervisor) if relayed else None
    signals = _RunSignals(supervisor, policy.grace_s, None if relay is None else relay.release)
    signals.install()
    try:
        if relay is not None:
            relay.raw()
        handle = supervisor.start(
            list(options.command),
            stdin=stdin,
            stdout=_output(options, relayed=relay is not None),
            pty=False if relay is None else relay.size,
            session_id=notifier.session_id,
            loop_id=loop_id,
            **_start_options(options),
        )
        if relay is not None:
            relay.attach(handle)
        signals.attach(handle)
        record = supervisor.wait(handle)
        returncode = supervisor.returncode(handle)
    finally:
        if relay is not None:
            relay.close()
        signals.restore()
        supervisor.shutdown(policy.grace_s)
    return record, _run_exit_code(record, returncode, signals.shutdown_signal)


def _output(options: RunOptions, *, relayed: bool) -> Callable[[bytes], None] | None:
    """Where the child's output goes: stderr with ``--json``, ours with a relayed terminal
    (kept or not), else the capture passes it to ours (``None``)."""
    if options.as_json or relayed:
        return _passing_to(2 if options.as_json else 1)
    return None


def _relay(supervisor: Supervisor) -> TerminalRelay:
    from procledger.cli.terminal_relay import TerminalRelay

    return TerminalRelay(supervisor)


def _start_options(options: RunOptions) -> dict[str, Any]:
    """``Supervisor.start``'s options as ``run``'s say them."""
    return {
        "background": options.background,
        "capture": options.capture,
        "output_limit": options.output_limit,
        "ready": options.ready,
        "restart": options.restart,
        "name": options.name,
        "port": options.port,
    }


def _notice(line: str) -> None:
    """The supervisor's word that an outcome waits for the store, and that it got through."""
    os.write(2, f"{PROG}: {one_line(line)}\n".encode(errors="backslashreplace"))


def _passing_to(fd: int) -> Callable[[bytes], None]:
    """The child's output, passed on to our ``fd``: stdout, or stderr with ``--json`` (whose
    stdout carries only the final record). When its reader went away, the child meets the
    broken pipe (``ReaderGone``), as if it had written there itself."""

    def write(chunk: bytes) -> None:
        view = memoryview(chunk)
        try:
            while view:
                view = view[os.write(fd, view) :]
        except BrokenPipeError as exc:
            from procledger.supervisor.execution import ReaderGone

            raise ReaderGone from exc

    return write


def start_after_agent_died(url: str | None, process_id: str, wait_s: float) -> str | None:
    """The agent died while starting the command: the anchor starts it again, and the new
    agent records what became of the start (running, if the child was spawned; else lost).
    What the ledger says is the answer: ``None`` when it runs, else how it ended."""
    from procledger.agent.launch import ask, ensure_agent

    places, _ = ensure_agent(url)
    ask(places, {"op": "status"}, timeout=wait_s)  # answered once its takeover is done
    with open_ledger(url) as registry:
        try:
            record = registry.get(process_id)
        except ProcledgerError:
            record = None
    if record is None or record.is_terminal:
        return "it was not recorded" if record is None else ending(record)
    return None


def await_ready(url: str | None, process_id: str) -> str | None:
    """`run --background --wait-ready`: wait until it is ready (``None``), or say how it ended
    first -- the state and why (docs/design.md §15)."""
    with open_ledger(url, create=False, read_only=True) as registry:
        record = registry.await_ready(process_id)
    if record.is_terminal and record.ready_at_ms is None:
        return how_it_ended(record)
    return None
