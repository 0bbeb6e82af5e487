"""`procledger run`: supervise one command in the foreground, or -- with ``--background`` --
from a detached `procledger` that this one re-executes (docs/design.md §8).

The CLI's owner and notification session are in ``procledger.cli._owner``; `restore` uses them
too, for runs whose `procledger` died.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn

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
    is_utf8,
    one_line,
    open_ledger,
    option_errors,
    parse_grace,
    write_json,
)
from procledger.cli._format import ending
from procledger.cli._owner import cli_notifier, cli_owner
from procledger.domain.vocabulary import MAX_LEDGER_INT

if TYPE_CHECKING:
    from procledger import (
        ProcessHandle,
        ProcessRecord,
        ProcessRegistry,
        Readiness,
        RestartPolicy,
        StopPolicy,
        Supervisor,
    )

StdinSource = Literal["inherit", "null"] | Path
"""What the child reads: ``Supervisor.start``'s ``stdin`` (docs/design.md §6.2)."""

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


_CommandArgument = Annotated[
    list[str], typer.Argument(metavar="CMD", show_default=False, hidden=True)
]
_BackgroundOption = Annotated[
    bool,
    typer.Option(
        "--background",
        help="Supervise it from a detached procledger (its output is discarded, its stdin is "
        "/dev/null); print the process id once it runs and return 0.",
    ),
]
_GraceOption = Annotated[
    str,
    typer.Option(
        "--grace",
        metavar="S",
        help="Seconds between stop signals (finite, 0 to 86400).  [default: 10]",
        show_default=False,
    ),
]
_StopSignalOption = Annotated[
    str,
    typer.Option(
        "--stop-signal",
        metavar="SIG",
        help="Sent after SIGINT's grace on Ctrl-C (then SIGKILL after another grace).",
    ),
]
_StdinOption = Annotated[
    str | None,
    typer.Option(
        "--stdin",
        metavar="inherit|null|PATH",
        show_default=False,
        help="The command's stdin: this terminal or pipe (inherit; the default in the "
        "foreground), /dev/null (null; the default with --background), or a file.",
    ),
]
_JsonOption = Annotated[
    bool,
    typer.Option(
        "--json", help="Print the final record as JSON (the command's stdout goes to stderr)."
    ),
]
_NoCaptureOption = Annotated[
    bool, typer.Option("--no-capture", help="Keep none of the output (it still streams through).")
]
_OutputLimitOption = Annotated[
    str,
    typer.Option(
        "--output-limit",
        metavar="SIZE",
        help="Output kept across both streams (512KiB, 1MiB, 64MiB or bytes; 0 keeps nothing).",
    ),
]
_SIZE = re.compile(r"(\d+)\s*(B|KiB|MiB|GiB|K|M|G)?", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "kib": 1024, "m": 1024**2, "mib": 1024**2}
_SIZE_UNITS |= {"g": 1024**3, "gib": 1024**3}


def parse_size(text: str) -> int:
    """``--output-limit``: ``512KiB``, ``1MiB``, ``64MiB`` or plain bytes."""
    found = _SIZE.fullmatch(text.strip())
    if found is None:
        message = f"{text!r} is not a size such as 512KiB, 1MiB, 64MiB or a number of bytes"
        raise typer.BadParameter(message, param_hint="--output-limit")
    size = int(found.group(1)) * _SIZE_UNITS[(found.group(2) or "").lower()]
    if size > MAX_LEDGER_INT:
        message = f"{text!r} is more than the ledger can count ({MAX_LEDGER_INT} bytes)"
        raise typer.BadParameter(message, param_hint="--output-limit")
    return size


_Text = Annotated[str | None, typer.Option(show_default=False)]
_ReadyPortOption = Annotated[
    str | None,
    typer.Option("--ready-port", metavar="PORT", help="Ready once a TCP connect to it succeeds."),
]
_ReadyOutputOption = Annotated[
    str | None,
    typer.Option(
        "--ready-output", metavar="REGEX", help="Ready once a line of stdout or stderr matches."
    ),
]
_ReadyFileOption = Annotated[
    str | None, typer.Option("--ready-file", metavar="PATH", help="Ready once the path exists.")
]
_ReadyNotifyOption = Annotated[
    bool,
    typer.Option(
        "--ready-notify", help="Ready once it sends READY=1 to $NOTIFY_SOCKET (sd_notify)."
    ),
]
_ReadyTimeoutOption = Annotated[
    str | None,
    typer.Option(
        "--ready-timeout",
        metavar="DURATION",
        help="Not ready in time (0.2s, 60s, 5m, 1h): stop the tree, end failed/ready_timeout.",
    ),
]
_WaitReadyOption = Annotated[
    bool,
    typer.Option(
        "--wait-ready", help="With --background: return once it is ready (exit 1 if it ends)."
    ),
]
_RestartOption = Annotated[
    str | None,
    typer.Option(
        "--restart",
        metavar="never|on-failure|always",
        help="Start it again, as a new attempt, when it ends (on-failure: when it failed).",
    ),
]
_MaxRestartsOption = Annotated[
    str | None,
    typer.Option("--max-restarts", metavar="N", help="At most N restarts per --restart-window "
                 "(then a crash_loop).  [default: 5]", show_default=False),
]  # fmt: skip
_DurationHelp = {
    "--restart-window": "The window --max-restarts counts in.  [default: 60s]",
    "--backoff-initial": "Wait before the first restart, doubling each time.  [default: 0.2s]",
    "--backoff-max": "The longest wait between attempts.  [default: 30s]",
    "--reset-after": "Running (and ready) this long clears the restart count.",
}
_RestartWindowOption = Annotated[
    str | None,
    typer.Option("--restart-window", metavar="DURATION", help=_DurationHelp["--restart-window"]),
]
_BackoffInitialOption = Annotated[
    str | None,
    typer.Option("--backoff-initial", metavar="DURATION", help=_DurationHelp["--backoff-initial"]),
]
_BackoffMaxOption = Annotated[
    str | None,
    typer.Option("--backoff-max", metavar="DURATION", help=_DurationHelp["--backoff-max"]),
]
_ResetAfterOption = Annotated[
    str | None,
    typer.Option("--reset-after", metavar="DURATION", help=_DurationHelp["--reset-after"]),
]


@dataclass(frozen=True, slots=True)
class _Service:
    """`run`'s readiness and restart flags: parsed (``domain/service.py``), and as written,
    to hand on to a detached `procledger`."""

    ready: Readiness | None = None
    restart: RestartPolicy | None = None
    argv: tuple[str, ...] = ()

    def options(self) -> list[str]:
        return list(self.argv)


def service_flags(flags: dict[str, Any]) -> _Service:
    """The ``--ready-*`` and restart flags (by their names) checked before anything is
    recorded; a bad one is a usage error naming it (exit 2)."""
    from procledger.domain.service import readiness_options, restart_options

    with option_errors():
        ready = readiness_options(
            port=flags["--ready-port"],
            output=flags["--ready-output"],
            file=flags["--ready-file"],
            notify=bool(flags["--ready-notify"]),
            timeout=flags["--ready-timeout"],
        )
        restart = restart_options(
            restart=flags["--restart"],
            max_restarts=flags["--max-restarts"],
            window=flags["--restart-window"],
            backoff_initial=flags["--backoff-initial"],
            backoff_max=flags["--backoff-max"],
            reset_after=flags["--reset-after"],
        )
    argv: list[str] = ["--ready-notify"] if flags["--ready-notify"] else []
    for flag, value in flags.items():
        if isinstance(value, str):
            argv += [flag, value]
    return _Service(ready, restart, tuple(argv))


_SERVICE_PARAMETERS = (
    "ready_port", "ready_output", "ready_file", "ready_notify", "ready_timeout", "restart",
    "max_restarts", "restart_window", "backoff_initial", "backoff_max", "reset_after",
)  # fmt: skip


def _checked_service(params: dict[str, Any]) -> _Service:
    """`run`'s service flags from its parsed parameters, with the rules that tie them to
    other flags; a usage error (exit 2) names the flag."""
    service = service_flags(
        {f"--{name.replace('_', '-')}": params[name] for name in _SERVICE_PARAMETERS}
    )
    if params["wait_ready"] and not params["background"]:
        raise typer.BadParameter("only with --background", param_hint="--wait-ready")
    if service.ready is not None and service.ready.output is not None and params["no_capture"]:
        message = "needs the output captured (drop --no-capture)"
        raise typer.BadParameter(message, param_hint="--ready-output")
    return service


# How a `run --background` talks to the detached `procledger` it starts; not for people.
_DetachedFdOption = Annotated[int | None, typer.Option("--detached-fd", hidden=True)]
_ProcessIdOption = Annotated[str | None, typer.Option("--process-id", hidden=True)]


def run(
    ctx: typer.Context,
    command: _CommandArgument,
    *,
    background: _BackgroundOption = False,
    grace: _GraceOption = "10",
    stop_signal: _StopSignalOption = "TERM",
    stdin: _StdinOption = None,
    as_json: _JsonOption = False,
    no_capture: _NoCaptureOption = False,
    output_limit: _OutputLimitOption = "64MiB",
    ready_port: _ReadyPortOption = None,
    ready_output: _ReadyOutputOption = None,
    ready_file: _ReadyFileOption = None,
    ready_notify: _ReadyNotifyOption = False,
    ready_timeout: _ReadyTimeoutOption = None,
    wait_ready: _WaitReadyOption = False,
    restart: _RestartOption = None,
    max_restarts: _MaxRestartsOption = None,
    restart_window: _RestartWindowOption = None,
    backoff_initial: _BackoffInitialOption = None,
    backoff_max: _BackoffMaxOption = None,
    reset_after: _ResetAfterOption = None,
    detached_fd: _DetachedFdOption = None,
    process_id: _ProcessIdOption = None,
) -> None:
    """Run a command under supervision and record its whole lifecycle.

    Its output streams through and is kept (see `logs`); its stdin is this one's (a pipe or
    the terminal). The first Ctrl-C stops its whole tree (SIGINT, then --stop-signal, then
    SIGKILL, --grace apart); a second kills it at once. Exits with the command's code; 130
    if it was stopped on request; 128+N if signal N ended it; 127 if the command was not
    found, 126 if it could not be executed.

    --ready-* probes (all must hold) record when it is ready; --restart starts it again as new
    attempts of one service, with backoff, until --max-restarts per --restart-window."""
    _dispatch(ctx, command, ctx.params)


def _dispatch(ctx: typer.Context, command: list[str], params: dict[str, Any]) -> None:
    """`run` with its flags checked (usage errors before anything is recorded): in the
    foreground, detached, or as the detached side itself."""
    from procledger import StopPolicy

    service = _checked_service(params)
    grace_s = parse_grace(params["grace"])
    policy = StopPolicy((signal.SIGINT, _parse_signal(params["stop_signal"])), grace_s)
    source = _parse_stdin(params["stdin"], params["background"])
    checked_command(command)
    keep = _Keep(not params["no_capture"], parse_size(params["output_limit"]), service)
    fd, process_id = params["detached_fd"], params["process_id"]
    if fd is not None and process_id is not None:
        _detached_main(ctx, command, policy, stdin=source, fd=fd, process_id=process_id, keep=keep)
    if params["background"]:
        signal_name = params["stop_signal"]
        detached = _run_detached(
            ctx, command, grace=grace_s, stop_signal=signal_name, stdin=source, keep=keep
        )
        (_wait_ready if params["wait_ready"] else _print_started)(ctx, detached)
        return
    _run_foreground(ctx, command, policy, stdin=source, as_json=params["as_json"], keep=keep)


@dataclass(frozen=True, slots=True)
class _Keep:
    """What `run` keeps of the output: whether it captures, and up to how many bytes."""

    capture: bool = True
    limit: int = 64 * 1024 * 1024
    service: _Service = _Service()

    def options(self) -> list[str]:
        capture = [] if self.capture else ["--no-capture"]
        return ["--output-limit", str(self.limit), *capture, *self.service.options()]


def _run_foreground(
    ctx: typer.Context,
    command: list[str],
    policy: StopPolicy,
    *,
    stdin: StdinSource,
    as_json: bool,
    keep: _Keep,
) -> NoReturn:
    """Supervise in this process until the terminal is recorded; exit as the command did."""
    with open_ledger(cli_state(ctx).url) as registry, _child_stdin(stdin) as child_stdin:
        try:
            record, exit_code = _supervise(
                registry,
                command,
                policy=policy,
                background=False,
                as_json=as_json,
                stdin=child_stdin,
                keep=keep,
            )
        except SpawnError as exc:  # recorded `failed`; exit as a shell would
            fail(cli_state(ctx), exc, _spawn_exit_code(exc))
    if as_json:
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
    return EXIT_NOT_FOUND if exc.errno == errno.ENOENT else EXIT_CANNOT_EXECUTE


def _parse_stdin(value: str | None, background: bool) -> StdinSource:
    """``--stdin``: ``inherit`` (foreground default), ``null`` (background default) or a
    readable file, checked before anything is recorded."""
    if value is None:
        return "null" if background else "inherit"
    if value == "null":
        return "null"
    if value == "inherit":
        if background:
            message = "a detached run has no stdin to inherit (use null or a file)"
            raise typer.BadParameter(message, param_hint="--stdin")
        return "inherit"
    path = Path(value).absolute()
    if not path.is_file() or not os.access(path, os.R_OK):
        message = f"{value!r} is neither inherit, null nor a readable file"
        raise typer.BadParameter(message, param_hint="--stdin")
    return path


def checked_command(command: list[str]) -> None:
    """Refuse, before anything is recorded, what the ledger cannot keep as text: an argument
    or a working directory that is not valid UTF-8 (docs/design.md §8) -- and an empty
    command word, which names no program."""
    if not command[0]:
        raise typer.BadParameter("the command is empty; nothing was recorded", param_hint="CMD")
    for index, word in enumerate(command):
        if not is_utf8(word):
            shown = os.fsencode(word)
            message = f"argument {index} ({shown!r}) is not valid UTF-8; nothing was recorded"
            raise typer.BadParameter(message, param_hint="CMD")
    try:
        workdir = os.getcwd()
    except FileNotFoundError:
        message = "the working directory was deleted: cd to one that exists; nothing was recorded"
        raise UnrecordableInput(message) from None
    if not is_utf8(workdir):
        raise UnrecordableInput(
            f"the working directory {os.fsencode(workdir)!r} is not valid UTF-8: "
            "run from another directory; nothing was recorded"
        )


class UnrecordableInput(ProcledgerError):
    """What `run` was given cannot be kept in the ledger as text (non-UTF-8 bytes)."""


def _parse_signal(value: str) -> signal.Signals:
    """``TERM``, ``SIGTERM`` or ``15``; anything else is a usage error (exit 2)."""
    name = value.strip().upper()
    try:
        if name.isdigit():
            return signal.Signals(int(name))
        return signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
    except (KeyError, ValueError):
        message = f"{value!r} is not a signal name or number"
        raise typer.BadParameter(message, param_hint="--stop-signal") from None


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
    command: list[str],
    *,
    policy: StopPolicy,
    background: bool,
    as_json: bool,
    stdin: StdinSource | int,
    process_id: str | None = None,
    started: Callable[[ProcessHandle], None] | None = None,
    keep: _Keep = _Keep(),
) -> tuple[ProcessRecord, int]:
    """Run ``command`` under a fresh CLI supervisor until its terminal is recorded."""
    from procledger import Supervisor

    owner = cli_owner()
    notifier, loop_id = cli_notifier(registry, owner)
    supervisor = Supervisor(
        registry, owner=owner, notifier=notifier, stop=policy, notice=_notice, subreaper=True
    )
    signals = _RunSignals(supervisor, policy.grace_s)
    signals.install()
    try:
        handle = supervisor.start(
            command,
            process_id=process_id,
            stdin=stdin,
            stdout=_to_stderr if as_json else None,
            background=background,
            session_id=notifier.session_id,
            loop_id=loop_id,
            capture=keep.capture,
            output_limit=keep.limit,
            ready=keep.service.ready,
            restart=keep.service.restart,
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


def _run_detached(
    ctx: typer.Context,
    command: list[str],
    *,
    grace: float,
    stop_signal: str,
    stdin: StdinSource,
    keep: _Keep,
) -> str:
    """`run --background`: a detached `procledger` (own session, no terminal) supervises the
    command; this one waits until it is recorded `backgrounded` and returns its id."""
    from procledger.supervisor.minting import new_process_id

    process_id = new_process_id(int(time.time() * 1000))
    read_fd, write_fd = os.pipe()
    argv = [sys.executable, "-m", "procledger", "run", "--background", "--grace", repr(grace)]
    argv += ["--stop-signal", stop_signal, "--stdin", str(stdin), "--detached-fd", str(write_fd)]
    argv += ["--process-id", process_id, *keep.options(), "--", *command]
    try:
        _spawn_detached(argv, write_fd, cli_state(ctx).url)
    finally:
        os.close(write_fd)
    with os.fdopen(read_fd, "rb") as report:
        answer = report.read().decode(errors="replace").strip()
    if not answer.startswith("ok"):
        error = BackgroundStartError(answer or "the detached supervisor exited without a word")
        fail(cli_state(ctx), error, _detached_exit_code(answer))
    return process_id


def _print_started(ctx: typer.Context, process_id: str) -> None:
    """The id of the process a detached `procledger` runs (--json: its record)."""
    if ctx.params.get("as_json"):
        with open_ledger(cli_state(ctx).url) as registry:
            write_json(dump(registry.get(process_id)))
    else:
        sys.stdout.write(f"{process_id}\n")


def _wait_ready(ctx: typer.Context, process_id: str) -> None:
    """`run --background --wait-ready`: return once it is ready (printing its id, or with
    --json the record); if it ended first, say how and exit 1 (docs/design.md §15)."""
    with open_ledger(cli_state(ctx).url) as registry:
        record = registry.await_ready(process_id)
    if record.is_terminal and record.ready_at_ms is None:
        error = NotReady(f"process {record.id} ended before it was ready: {ending(record)}")
        fail(cli_state(ctx), error)
    _print_started(ctx, process_id)


class NotReady(ProcledgerError):
    """A process (or every attempt of a service) ended before it was ready."""


def _detached_exit_code(answer: str) -> int:
    """127/126 when the detached side could not start the command (its ``SpawnError`` line
    carries the errno), as in the foreground; 1 for any other failure."""
    found = re.match(r"SpawnError: \[Errno (\d+)\]", answer)
    if found is None:
        return EXIT_FAILURE
    return EXIT_NOT_FOUND if int(found.group(1)) == errno.ENOENT else EXIT_CANNOT_EXECUTE


_DETACHED_URL = "PROCLEDGER_DETACHED_URL"
"""How the store URL reaches the detached `procledger`: in its environment, which only its user
can read, never on its command line, which every user can (a PostgreSQL URL holds a password).
The detached side takes it out again, so the command inherits the environment `run` had."""


def _spawn_detached(argv: list[str], report_fd: int, url: str | None) -> None:
    """Its own session and no terminal: the detached `procledger` outlives this one and the
    terminal's Ctrl-C; it keeps only the pipe it reports on."""
    env = {**os.environ, _DETACHED_URL: url} if url else None
    with open(os.devnull, "rb") as null_in, open(os.devnull, "wb") as null_out:
        subprocess.Popen(
            argv,
            stdin=null_in,
            stdout=null_out,
            stderr=null_out,
            env=env,
            pass_fds=(report_fd,),
            start_new_session=True,
        )


def _detached_main(
    ctx: typer.Context,
    command: list[str],
    policy: StopPolicy,
    *,
    stdin: StdinSource,
    fd: int,
    process_id: str,
    keep: _Keep,
) -> NoReturn:
    """The detached side of `run --background`: report on ``fd`` once the command runs."""
    report = os.fdopen(fd, "wb")
    url = os.environ.pop(_DETACHED_URL, None)
    if url:
        cli_state(ctx).url = url

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
                stdin=stdin,
                process_id=process_id,
                started=started,
                keep=keep,
            )
    except BaseException as exc:
        if not report.closed:
            report.write(f"{type(exc).__name__}: {one_line(str(exc))}\n".encode())
            report.close()
        raise
    raise typer.Exit(exit_code)
