"""`procledger run`: supervise one command in the foreground, or -- with ``--background`` --
from a detached `procledger` that this one re-executes (docs/design.md §8).

The CLI's owner and notification session are in ``procledger.cli._owner``; `restore` uses them
too, for runs whose `procledger` died.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from procledger import ProcessState, ProcledgerError, TerminalReason
from procledger.cli._app import (
    EXIT_FAILURE,
    EXIT_STOPPED,
    PROG,
    cli_state,
    dump,
    one_line,
    open_ledger,
    write_json,
)
from procledger.cli._format import outcome
from procledger.cli._owner import cli_notifier, cli_owner

if TYPE_CHECKING:
    from procledger import (
        ProcessHandle,
        ProcessRecord,
        ProcessRegistry,
        StopPolicy,
        Supervisor,
    )

RUN_CONTEXT_SETTINGS = {"allow_interspersed_args": False, "ignore_unknown_options": True}
"""Everything after the command's first word is the command's own, options included."""

_CommandArgument = Annotated[list[str], typer.Argument(metavar="-- CMD...", show_default=False)]
_BackgroundOption = Annotated[
    bool,
    typer.Option(
        "--background",
        help="Supervise it from a detached procledger (its output is discarded); print "
        "the process id once it runs and return 0.",
    ),
]
_GraceOption = Annotated[
    float,
    typer.Option("--grace", min=0.0, metavar="S", help="Seconds between stop signals."),
]
_StopSignalOption = Annotated[
    str,
    typer.Option(
        "--stop-signal",
        metavar="SIG",
        help="Sent after SIGINT's grace on Ctrl-C (then SIGKILL after another grace).",
    ),
]
_JsonOption = Annotated[
    bool,
    typer.Option(
        "--json", help="Print the final record as JSON (the command's stdout goes to stderr)."
    ),
]
# How a `run --background` talks to the detached `procledger` it starts; not for people.
_DetachedFdOption = Annotated[int | None, typer.Option("--detached-fd", hidden=True)]
_ProcessIdOption = Annotated[str | None, typer.Option("--process-id", hidden=True)]


def run(
    ctx: typer.Context,
    command: _CommandArgument,
    *,
    background: _BackgroundOption = False,
    grace: _GraceOption = 10.0,
    stop_signal: _StopSignalOption = "TERM",
    as_json: _JsonOption = False,
    detached_fd: _DetachedFdOption = None,
    process_id: _ProcessIdOption = None,
) -> None:
    """Supervise a command: its output streams through, everything is recorded. First Ctrl-C
    stops its whole tree (SIGINT, --stop-signal, SIGKILL), a second kills it at once. Exits
    with the command's code, 130 if it was stopped on request, 128+N if signal N ended it."""
    from procledger import StopPolicy

    policy = StopPolicy((signal.SIGINT, _parse_signal(stop_signal)), grace)
    if detached_fd is not None and process_id is not None:
        _detached_main(ctx, command, policy, detached_fd, process_id)
    if background:
        _run_detached(ctx, command, grace=grace, stop_signal=stop_signal, as_json=as_json)
        return
    with open_ledger(cli_state(ctx).url) as registry:
        record, exit_code = _supervise(
            registry, command, policy=policy, background=False, as_json=as_json
        )
    if as_json:
        write_json(dump(record))
    elif exit_code and sys.stderr.isatty():
        sys.stderr.write(f"{PROG}: process {record.id} {record.state.value} ({outcome(record)})\n")
    raise typer.Exit(exit_code)


def _parse_signal(value: str) -> signal.Signals:
    """``TERM``, ``SIGTERM`` or ``15``; anything else is a usage error (exit 2)."""
    name = value.strip().upper()
    try:
        if name.isdigit():
            return signal.Signals(int(name))
        return signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
    except (KeyError, ValueError):
        raise typer.BadParameter(f"{value!r} is not a signal name or number") from None


class _RunSignals:
    """What Ctrl-C, SIGTERM and SIGHUP do to a supervised run, from the main thread's handlers.

    Handlers only start threads: a registry write inside a handler could re-enter a write the
    main thread was in the middle of. First Ctrl-C: stop with the run's policy (SIGINT, then
    --stop-signal after the grace, then SIGKILL). Second: kill now. SIGTERM/SIGHUP: shut the
    supervisor down (terminal `runner_shutdown`)."""

    def __init__(self, supervisor: Supervisor, grace_s: float) -> None:
        self._supervisor = supervisor
        self._grace_s = grace_s
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
        if first and self._handle is not None:
            self._background(self._supervisor.shutdown, self._grace_s)

    def _request(self, press: int) -> None:
        reason = TerminalReason.interrupted if press == 0 else TerminalReason.killed
        self._background(self._supervisor.request_stop, self._handle, reason)

    def _background(self, target: Callable[..., object], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name="procledger-cli-stop")
        self._threads.append(thread)
        thread.start()


def _run_exit_code(record: ProcessRecord, returncode: int | None, shutdown: int | None) -> int:
    """`run`'s exit status: the child's own code, 130 when stopped on request, 128 + signal
    when a signal nobody asked for ended it (docs/design.md §8)."""
    if record.state is ProcessState.exited:
        return record.exit_code or 0
    if record.reason is TerminalReason.runner_shutdown:
        return 128 + (shutdown or signal.SIGTERM)
    stopped = (ProcessState.interrupted, ProcessState.terminated, ProcessState.killed)
    if record.state in stopped and record.stop_requested:
        return EXIT_STOPPED
    if returncode is not None and returncode < 0:
        return 128 - returncode
    return EXIT_FAILURE


def _supervise(
    registry: ProcessRegistry,
    command: list[str],
    *,
    policy: StopPolicy,
    background: bool,
    as_json: bool,
    process_id: str | None = None,
    started: Callable[[ProcessHandle], None] | None = None,
) -> tuple[ProcessRecord, int]:
    """Run ``command`` under a fresh CLI supervisor until its terminal is recorded."""
    from procledger import Supervisor

    owner = cli_owner()
    notifier, loop_id = cli_notifier(registry, owner)
    supervisor = Supervisor(registry, owner=owner, notifier=notifier, stop=policy)
    signals = _RunSignals(supervisor, policy.grace_s)
    signals.install()
    try:
        handle = supervisor.start(
            command,
            process_id=process_id,
            stdout=_to_stderr if as_json else None,
            background=background,
            session_id=notifier.session_id,
            loop_id=loop_id,
        )
        if started is not None:
            started(handle)
        signals.attach(handle)
        record = supervisor.wait(handle)
        returncode = supervisor.returncode(handle)
    finally:
        signals.restore()
        supervisor.shutdown(policy.grace_s)
    return record, _run_exit_code(record, returncode, signals.shutdown_signal)


def _to_stderr(chunk: bytes) -> None:
    """With --json, stdout carries only the final record: the child's output goes to stderr."""
    view = memoryview(chunk)
    while view:
        view = view[os.write(2, view) :]


class BackgroundStartError(ProcledgerError):
    """`run --background` could not start its detached supervisor or its command."""


def _run_detached(
    ctx: typer.Context, command: list[str], *, grace: float, stop_signal: str, as_json: bool
) -> None:
    """`run --background`: a detached `procledger` (own session, no terminal) supervises the
    command; this one waits until it is recorded `backgrounded`, prints it and returns 0."""
    from procledger.supervisor.handles import new_process_id

    url = cli_state(ctx).url
    process_id = new_process_id(int(time.time() * 1000))
    read_fd, write_fd = os.pipe()
    argv = [sys.executable, "-m", "procledger", *(["--url", url] if url else [])]
    argv += ["run", "--background", "--grace", str(grace), "--stop-signal", stop_signal]
    argv += ["--detached-fd", str(write_fd), "--process-id", process_id, "--", *command]
    try:
        _spawn_detached(argv, write_fd)
    finally:
        os.close(write_fd)
    with os.fdopen(read_fd, "rb") as report:
        answer = report.read().decode(errors="replace").strip()
    if not answer.startswith("ok"):
        raise BackgroundStartError(answer or "the detached supervisor exited without a word")
    with open_ledger(url) as registry:
        record = registry.get(process_id)
    if as_json:
        write_json(dump(record))
    else:
        sys.stdout.write(f"{record.id}\n")


def _spawn_detached(argv: list[str], report_fd: int) -> None:
    """Its own session and no terminal: the detached `procledger` outlives this one and the
    terminal's Ctrl-C; it keeps only the pipe it reports on."""
    with open(os.devnull, "rb") as null_in, open(os.devnull, "wb") as null_out:
        subprocess.Popen(
            argv,
            stdin=null_in,
            stdout=null_out,
            stderr=null_out,
            pass_fds=(report_fd,),
            start_new_session=True,
        )


def _detached_main(
    ctx: typer.Context, command: list[str], policy: StopPolicy, fd: int, process_id: str
) -> NoReturn:
    """The detached side of `run --background`: report on ``fd`` once the command runs."""
    report = os.fdopen(fd, "wb")

    def started(_handle: ProcessHandle) -> None:
        report.write(b"ok\n")
        report.close()

    try:
        with open_ledger(cli_state(ctx).url) as registry:
            _, exit_code = _supervise(
                registry,
                command,
                policy=policy,
                background=True,
                as_json=False,
                process_id=process_id,
                started=started,
            )
    except BaseException as exc:
        if not report.closed:
            report.write(f"{type(exc).__name__}: {one_line(str(exc))}\n".encode())
            report.close()
        raise
    raise typer.Exit(exit_code)
