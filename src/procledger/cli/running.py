"""`procledger run`: supervise one command in the foreground, or -- with ``--background`` --
from a detached `procledger` that this one re-executes (docs/design.md §8).

The CLI's owner and notification session are in ``procledger.cli._owner``; `restore` uses them
too, for runs whose `procledger` died.
"""

from __future__ import annotations

import errno
import inspect
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import orjson
import typer

from procledger import ProcessState, ProcledgerError, SpawnError, TerminalReason
from procledger.cli._app import (
    EXIT_FAILURE,
    EXIT_STOPPED,
    PROG,
    Command,
    cli_state,
    dump,
    fail,
    one_line,
    open_ledger,
    write_json,
)
from procledger.cli._format import ending
from procledger.cli._owner import cli_notifier, cli_owner
from procledger.cli.run_options import Detached, RunOptions, StdinSource

if TYPE_CHECKING:
    from procledger import ProcessHandle, ProcessRecord, ProcessRegistry, StopPolicy, Supervisor

RUN_CONTEXT_SETTINGS = {"allow_interspersed_args": False}
"""Options before ``--`` or the command's first word are ``run``'s own and parsed strictly (an
unknown one is a usage error: exit 2, nothing recorded); everything after is the command's."""

EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127
"""What shells exit with when a command cannot be executed (126) or found (127)."""
_HINT_AFTER_S = 0.5
"""How long the first Ctrl-C's stop may take before the hint about the second one is shown."""


class RunCommand(Command):
    """``run``'s usage line says what to type -- ``[--] CMD [ARG]...`` -- instead of typer's
    rendering of a variadic argument (``{-- CMD...}...``, ``<list[str]>``)."""

    bytes_options = frozenset({"stdin"})

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return ["[OPTIONS]", "[--] CMD [ARG]..."]


def run(ctx: typer.Context, **params: Any) -> None:
    """Run a command under supervision and record its whole lifecycle.

    Its output streams through and is kept (see `logs`); its stdin is this one's (a pipe or
    the terminal). The first Ctrl-C stops its whole tree (SIGINT, then --stop-signal, then
    SIGKILL, --grace apart); a second kills it at once. Exits with the command's code; 130
    if it was stopped on request; 128+N if signal N ended it; 127 if the command was not
    found, 126 if it could not be executed.

    --ready-* probes (all must hold) record when it is ready; --restart starts it again as new
    attempts of one service, with backoff, until --max-restarts per --restart-window."""
    options = RunOptions.parse(params)
    if not options.background:
        _run_foreground(ctx, options)
    process_id = _run_detached(ctx, options)
    (_wait_ready if options.wait_ready else _print_started)(ctx, options, process_id)


# typer reads `run`'s parameters from this signature: each flag is declared once, on the
# `RunOptions` field it sets (cli/run_options.py; docs/design.md §8).
run.__signature__ = RunOptions.signature(  # type: ignore[attr-defined]
    inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
)


def _stop_policy(options: RunOptions) -> StopPolicy:
    """Ctrl-C's ladder: SIGINT, then --stop-signal, then SIGKILL, --grace apart."""
    from procledger import StopPolicy

    return StopPolicy((signal.SIGINT, options.stop_signal), options.grace_s)


def _run_foreground(ctx: typer.Context, options: RunOptions) -> NoReturn:
    """Supervise in this process until the terminal is recorded; exit as the command did."""
    with open_ledger(cli_state(ctx).url) as registry, _child_stdin(options.stdin) as stdin:
        try:
            record, exit_code = _supervise(registry, options, stdin=stdin)
        except SpawnError as exc:  # recorded `failed`; exit as a shell would
            fail(cli_state(ctx), exc, _spawn_exit_code(exc))
    if options.as_json:
        write_json(dump(record))
    elif exit_code and sys.stderr.isatty() and record.signal != signal.SIGPIPE:
        # (SIGPIPE is a pipeline's quiet end -- `| head` -- which no shell reports either.)
        sys.stderr.write(f"{PROG}: process {record.id} {ending(record)}\n")
    raise typer.Exit(exit_code)


@contextmanager
def _child_stdin(stdin: StdinSource) -> Iterator[StdinSource | int]:
    """What the child reads: a terminal is passed on through a pipe, since a child in its own
    process group would be stopped reading the terminal itself (cli/terminal_input.py)."""
    if stdin != "inherit":
        yield stdin
        return
    from procledger.cli.terminal_input import terminal_stdin

    with terminal_stdin() as fed:
        yield stdin if fed is None else fed


def _spawn_exit_code(exc: SpawnError) -> int:
    """127 when the program is not there, 126 when it is but cannot be executed."""
    return _errno_exit_code(exc.errno)


def _errno_exit_code(number: int | None) -> int:
    return EXIT_NOT_FOUND if number == errno.ENOENT else EXIT_CANNOT_EXECUTE


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
    registry: ProcessRegistry,
    options: RunOptions,
    *,
    stdin: StdinSource | int,
    process_id: str | None = None,
    started: Callable[[ProcessHandle], None] | None = None,
) -> tuple[ProcessRecord, int]:
    """Run the command under a fresh CLI supervisor until its terminal is recorded."""
    from procledger import Supervisor

    policy = _stop_policy(options)
    owner = cli_owner()
    notifier, loop_id = cli_notifier(registry, owner)
    supervisor = Supervisor(
        registry, owner=owner, notifier=notifier, stop=policy, notice=_notice, subreaper=True
    )
    signals = _RunSignals(supervisor, policy.grace_s)
    signals.install()
    try:
        handle = supervisor.start(
            list(options.command),
            process_id=process_id,
            stdin=stdin,
            stdout=_to_stderr if options.as_json else None,
            background=options.background,
            session_id=notifier.session_id,
            loop_id=loop_id,
            capture=options.capture,
            output_limit=options.output_limit,
            ready=options.ready,
            restart=options.restart,
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


def _notice(line: str) -> None:
    """The supervisor's word that an outcome waits for the store, and that it got through."""
    os.write(2, f"{PROG}: {one_line(line)}\n".encode(errors="backslashreplace"))


def _to_stderr(chunk: bytes) -> None:
    """With --json, stdout carries only the final record: the child's output goes to stderr.
    When stderr's reader went away, the child meets the broken pipe (``ReaderGone``), as
    without --json."""
    view = memoryview(chunk)
    try:
        while view:
            view = view[os.write(2, view) :]
    except BrokenPipeError as exc:
        from procledger.supervisor.execution import ReaderGone

        raise ReaderGone from exc


class BackgroundStartError(ProcledgerError):
    """`run --background` could not start its detached supervisor or its command."""


def _run_detached(ctx: typer.Context, options: RunOptions) -> str:
    """`run --background`: a detached `procledger` (own session, no terminal) supervises the
    command; this one waits until it is recorded `backgrounded` and returns its id."""
    from procledger.supervisor.minting import new_process_id

    process_id = new_process_id(int(time.time() * 1000))
    read_fd, write_fd = os.pipe()
    handoff = Detached(options, process_id, cli_state(ctx).url, write_fd)
    try:
        _spawn_detached(handoff)
    finally:
        os.close(write_fd)
    with os.fdopen(read_fd, "rb") as report:
        answer = _Answer.read(report.read())
    if answer.error is not None:
        fail(cli_state(ctx), BackgroundStartError(answer.error), answer.exit_code())
    return process_id


def _print_started(ctx: typer.Context, options: RunOptions, process_id: str) -> None:
    """The id of the process a detached `procledger` runs (--json: its record)."""
    if options.as_json:
        with open_ledger(cli_state(ctx).url) as registry:
            write_json(dump(registry.get(process_id)))
    else:
        sys.stdout.write(f"{process_id}\n")


def _wait_ready(ctx: typer.Context, options: RunOptions, process_id: str) -> None:
    """`run --background --wait-ready`: return once it is ready (printing its id, or with
    --json the record); if it ended first, say how and exit 1 (docs/design.md §15)."""
    with open_ledger(cli_state(ctx).url) as registry:
        record = registry.await_ready(process_id)
    if record.is_terminal and record.ready_at_ms is None:
        error = NotReady(f"process {record.id} ended before it was ready: {ending(record)}")
        fail(cli_state(ctx), error)
    _print_started(ctx, options, process_id)


class NotReady(ProcledgerError):
    """A process (or every attempt of a service) ended before it was ready."""


@dataclass(frozen=True, slots=True)
class _Answer:
    """The detached side's one JSON line on the report pipe: ``{}`` once the command runs,
    else the error that stopped it (``errno`` for a ``SpawnError``, so the exit code is a
    shell's, as in the foreground)."""

    error: str | None = None
    errno: int | None = None

    @staticmethod
    def read(data: bytes) -> _Answer:
        if not data.strip():
            return _Answer("the detached supervisor exited without a word")
        found = orjson.loads(data)
        return _Answer(found.get("error"), found.get("errno"))

    @staticmethod
    def of(exc: BaseException) -> bytes:
        error = f"{type(exc).__name__}: {one_line(str(exc))}"
        number = exc.errno if isinstance(exc, SpawnError) else None
        return orjson.dumps({"error": error, "errno": number}) + b"\n"

    def exit_code(self) -> int:
        """127/126 when the command could not be started, as in the foreground; else 1."""
        return EXIT_FAILURE if self.errno is None else _errno_exit_code(self.errno)


def _spawn_detached(handoff: Detached) -> None:
    """Its own session and no terminal: the detached `procledger` outlives this one and the
    terminal's Ctrl-C; it keeps only the pipe it reports on. Its options, the process id and
    the store URL reach it as one JSON document on its stdin (``Detached``): a pipe only the
    two ends can read, of any length, gone once read -- not its command line, which every
    user can read (a PostgreSQL URL holds a password), nor its environment, which the command
    would inherit."""
    argv = [sys.executable, "-m", "procledger", DETACHED_COMMAND]
    with open(os.devnull, "wb") as null_out:
        child = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=null_out,
            stderr=null_out,
            pass_fds=(handoff.report_fd,),
            start_new_session=True,
        )
    assert child.stdin is not None
    with suppress(BrokenPipeError), child.stdin:  # it died first: its silence says so
        child.stdin.write(handoff.to_json())


DETACHED_COMMAND = "run-detached"
"""The hidden command a `run --background` re-executes `procledger` as (not for people)."""


def run_detached(ctx: typer.Context) -> NoReturn:
    """The detached side of `run --background`: read the handoff (``Detached``) from stdin,
    supervise the command, and answer on the report pipe -- one JSON line -- once it runs."""
    if sys.stdin.isatty():
        raise typer.BadParameter(f"only '{PROG} run --background' starts this")
    handoff = Detached.from_json(sys.stdin.buffer.read())
    _stdin_from_devnull()
    cli_state(ctx).url = handoff.url
    report = os.fdopen(handoff.report_fd, "wb")

    def started(_handle: ProcessHandle) -> None:
        report.write(b"{}\n")
        report.close()

    try:
        with open_ledger(handoff.url) as registry:
            _, exit_code = _supervise(
                registry,
                handoff.options,
                stdin=handoff.options.stdin,
                process_id=handoff.process_id,
                started=started,
            )
    except BaseException as exc:
        if not report.closed:
            report.write(_Answer.of(exc))
            report.close()
        raise
    raise typer.Exit(exit_code)


def _stdin_from_devnull() -> None:
    """The handoff pipe is spent: nothing after it reads fd 0 but /dev/null."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
