"""The ``procledger`` command: ``procledger [--url URL] COMMAND ...`` (DESIGN.md §8).

How to add a command: decorate a function with ``@app.command()``, take ``ctx: typer.Context``
when it needs the global options (``cli_state(ctx).url``), and let library errors propagate.
``main`` is the one place that turns a ``ProcledgerError`` or ``OSError`` into exactly one line
on stderr and exit code 1; usage errors exit 2 (typer/click's own handling). Machine output goes
to stdout as plain text; nothing here opens a store unless the command needs one.

Start-up time: a command imports what it uses (the store, the supervisor, recovery, rich) in its
own body -- ``procledger table`` must not pay for PostgreSQL drivers and process trees. typer
reads every command's annotations on each invocation, so those name only cheap types.
"""

from __future__ import annotations

import importlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import orjson
import typer

from procledger.adapters.liveness import local_identity
from procledger.domain.errors import ProcledgerError
from procledger.domain.leases import LeaseOwner, LeaseTimings
from procledger.domain.lifecycle import render_markdown, render_mermaid
from procledger.domain.vocabulary import ProcessState, TerminalReason
from procledger.supervisor.modes import StopMode

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from procledger.domain.records import ProcessEvent, ProcessRecord
    from procledger.notifications import Notifier
    from procledger.recovery import Engine, RecoveryWorker, SweepReport
    from procledger.registry import ProcessRegistry
    from procledger.supervisor.execution import StopPolicy
    from procledger.supervisor.supervisor import ProcessHandle, Supervisor

PROG = "procledger"
EXIT_FAILURE = 1


@dataclass
class CliState:
    """What the global options decided, shared with every command through ``ctx.obj``."""

    url: str | None = None
    """``--url``; ``None`` lets ``open_registry`` fall back to ``$PROCLEDGER_URL``, then the
    default SQLite ledger (DESIGN.md §7)."""
    command: str | None = None
    """The subcommand being run, named in the error line."""


app = typer.Typer(
    name=PROG,
    help="Supervise OS processes and keep their whole lifecycle as an event-sourced log.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def cli_state(ctx: typer.Context) -> CliState:
    """The global options of this invocation (set up by the app callback)."""
    state = ctx.find_root().obj
    if not isinstance(state, CliState):  # pragma: no cover - only if a caller bypasses main()
        raise TypeError("procledger CLI state missing: run the app through procledger.cli.main")
    return state


@app.callback()
def _global_options(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            metavar="URL",
            help="Store URL (memory://, sqlite:///path.db, postgresql://...). "
            "Default: $PROCLEDGER_URL, else the SQLite ledger under $XDG_DATA_HOME/procledger.",
        ),
    ] = None,
) -> None:
    state = ctx.ensure_object(CliState)
    state.url = url
    state.command = ctx.invoked_subcommand


class TableFormat(StrEnum):
    markdown = "markdown"
    mermaid = "mermaid"


@app.command()
def table(
    fmt: Annotated[
        TableFormat,
        typer.Option(
            "--format",
            help="markdown: one row per (kind, state, reason); mermaid: the state diagram.",
        ),
    ] = TableFormat.markdown,
) -> None:
    """Print the closed lifecycle table (no store is opened)."""
    text = render_markdown() if fmt is TableFormat.markdown else render_mermaid()
    sys.stdout.write(text)


@contextmanager
def _ledger(ctx: typer.Context) -> Iterator[ProcessRegistry]:
    """The store the global options name, open for one command and closed after it."""
    from procledger.registry import open_registry

    registry = open_registry(cli_state(ctx).url)
    try:
        yield registry
    finally:
        registry.close()


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _fail(state: CliState, exc: BaseException) -> NoReturn:
    where = f"{PROG} {state.command}" if state.command else PROG
    detail = _one_line(str(exc)) or "(no message)"
    sys.stderr.write(f"{where}: {type(exc).__name__}: {detail}\n")
    sys.stderr.flush()
    raise SystemExit(EXIT_FAILURE)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``procledger`` script and of ``python -m procledger``."""
    state = CliState()
    try:
        app(args=list(argv) if argv is not None else None, prog_name=PROG, obj=state)
    except (ProcledgerError, OSError) as exc:
        _fail(state, exc)


# -- recovery: `sweep [--drain]` and `worker` (DESIGN.md §3.6) ------------------------------------
# Self-contained: the recovery issue owns these functions. Both run the worker on a thread, so
# Ctrl-C (SIGINT) and SIGTERM reach the main thread as exceptions, never inside a lock; the main
# thread then calls ``RecoveryWorker.stop()`` -- running attempts are cancelled, their trees
# stopped -- waits for the thread, prints what was done, and exits 130 (SIGINT) or 143 (SIGTERM).

_OwnerOption = Annotated[
    str | None,
    typer.Option(
        "--owner",
        metavar="ID",
        help="Worker owner id; attempts claim as ID:recovery:<uuid>. "
        "Default: procledger-worker@<host id>.",
    ),
]
_TtlOption = Annotated[
    int, typer.Option("--ttl-ms", min=1, help="Lease time to live (at least 3 x --renew-ms).")
]
_RenewOption = Annotated[
    int, typer.Option("--renew-ms", min=1, help="How often a running attempt renews its lease.")
]
_EngineOption = Annotated[
    list[str] | None,
    typer.Option(
        "--engine",
        metavar="KIND=MODULE:CALLABLE",
        help="Run engine inputs of KIND with MODULE:CALLABLE(record, lease, cancel) -> RunResult "
        "(repeatable). Without one, engine work of that kind is recorded failed.",
    ),
]
_JsonOption = Annotated[bool, typer.Option("--json", help="One JSON report per line.")]
_REPORT_FIELDS = ("ran", "abandoned", "skipped", "failed", "lost")


class _StopSignal(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


def _raise_stop_signal(signum: int, _frame: object) -> None:
    raise _StopSignal(signum)


def _load_engine(spec: str) -> tuple[str, Engine]:
    kind, _, target = spec.partition("=")
    module_name, _, attribute = target.partition(":")
    if not (kind and module_name and attribute):
        raise typer.BadParameter(f"{spec!r}: expected KIND=MODULE:CALLABLE", param_hint="--engine")
    try:
        found: object = importlib.import_module(module_name)
        for part in attribute.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise typer.BadParameter(f"{spec!r}: {exc}", param_hint="--engine") from None
    if not callable(found):
        raise typer.BadParameter(f"{spec!r}: not callable", param_hint="--engine")
    return kind, found


@dataclass(frozen=True)
class _WorkerSettings:
    """The recovery options, validated before any store is opened."""

    owner: LeaseOwner
    timings: LeaseTimings
    engines: dict[str, Engine]

    @classmethod
    def parse(
        cls, owner_id: str | None, ttl_ms: int, renew_ms: int, engines: Sequence[str]
    ) -> _WorkerSettings:
        try:
            timings = LeaseTimings(ttl_ms=ttl_ms, renew_ms=renew_ms)
        except ValueError:
            message = f"--ttl-ms ({ttl_ms}) must be at least 3 x --renew-ms ({renew_ms})"
            raise typer.BadParameter(message, param_hint="--ttl-ms") from None
        if owner_id is None:
            identity = local_identity()
            host = identity.host_id if identity and identity.host_id else socket.gethostname()
            owner_id = f"procledger-worker@{host}"
        engine_map = dict(_load_engine(spec) for spec in engines)
        return cls(LeaseOwner.local_process(owner_id), timings, engine_map)

    def worker(self, registry: ProcessRegistry) -> RecoveryWorker:
        from procledger.recovery import RecoveryWorker

        return RecoveryWorker(registry, self.owner, timings=self.timings, engines=self.engines)


def _print_report(report: SweepReport, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(report.model_dump_json() + "\n")
    else:
        counts = "  ".join(f"{name} {len(getattr(report, name))}" for name in _REPORT_FIELDS)
        sys.stdout.write(counts + "\n")
        for name in _REPORT_FIELDS:
            ids = getattr(report, name)
            if ids and name != "skipped":
                sys.stdout.write(f"  {name}: {' '.join(ids)}\n")
    sys.stdout.flush()


def _run_worker_thread(worker: RecoveryWorker, body: Callable[[], object]) -> int:
    """Run ``body`` on a thread; on SIGINT/SIGTERM stop ``worker`` and wait. The exit code.

    The main thread waits on an ``Event``, not on ``Thread.join(timeout)``: before Python 3.13
    an interrupted ``join`` can leave the thread looking finished while it still runs."""
    failure: list[BaseException] = []
    finished = threading.Event()

    def target() -> None:
        try:
            body()
        except BaseException as exc:
            failure.append(exc)
        finally:
            finished.set()

    thread = threading.Thread(target=target, name="procledger-recovery")
    previous = signal.signal(signal.SIGTERM, _raise_stop_signal)
    exit_code = 0
    try:
        thread.start()
        try:
            while not finished.wait(0.2):
                pass
        except KeyboardInterrupt:
            exit_code = 128 + signal.SIGINT
        except _StopSignal as stop:
            exit_code = 128 + stop.signum
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the first request is being carried out
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        worker.stop()
        finished.wait()
        thread.join()
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if failure:
        raise failure[0]
    return exit_code


def _recover(
    ctx: typer.Context, settings: _WorkerSettings, work: Callable[[RecoveryWorker], object]
) -> int:
    """Open the store, run ``work`` with this command's recovery worker on a thread (see
    ``_run_worker_thread``) and close the store; the exit code."""
    with _ledger(ctx) as registry:
        recovery = settings.worker(registry)
        return _run_worker_thread(recovery, lambda: work(recovery))


@app.command()
def sweep(
    ctx: typer.Context,
    *,
    drain: Annotated[
        bool,
        typer.Option(
            "--drain",
            help="Instead of a sweep: abandon (owner_drain) every started owner_bound process "
            "first started by this owner or its recovery attempts.",
        ),
    ] = False,
    owner: _OwnerOption = None,
    ttl_ms: _TtlOption = 30_000,
    renew_ms: _RenewOption = 10_000,
    engine: _EngineOption = None,
    as_json: _JsonOption = False,
) -> None:
    """One recovery pass by declared disposition, then print what was done."""
    settings = _WorkerSettings.parse(owner, ttl_ms, renew_ms, engine or ())
    reports: list[SweepReport] = []
    exit_code = _recover(
        ctx,
        settings,
        lambda recovery: reports.append(recovery.drain() if drain else recovery.sweep()),
    )
    for report in reports:
        _print_report(report, as_json)
    if exit_code:
        raise typer.Exit(exit_code)


@app.command()
def worker(
    ctx: typer.Context,
    *,
    interval: Annotated[
        float, typer.Option("--interval", min=0.0, help="Seconds to wait between sweeps.")
    ] = 1.0,
    max_sweeps: Annotated[
        int | None, typer.Option("--max-sweeps", min=1, help="Exit 0 after this many sweeps.")
    ] = None,
    owner: _OwnerOption = None,
    ttl_ms: _TtlOption = 30_000,
    renew_ms: _RenewOption = 10_000,
    engine: _EngineOption = None,
    as_json: _JsonOption = False,
) -> None:
    """Sweep, wait, repeat -- running recoverable work -- until Ctrl-C (exit 130) or SIGTERM
    (exit 143). Prints a report after each sweep that did something (--json: after each)."""
    settings = _WorkerSettings.parse(owner, ttl_ms, renew_ms, engine or ())

    def on_report(report: SweepReport) -> None:
        busy = any(getattr(report, name) for name in _REPORT_FIELDS if name != "skipped")
        if as_json or busy:
            _print_report(report, as_json)

    def serve(recovery: RecoveryWorker) -> None:
        recovery.serve(interval_s=interval, max_sweeps=max_sweeps, on_report=on_report)

    exit_code = _recover(ctx, settings, serve)
    if exit_code:
        raise typer.Exit(exit_code)


# -- projections: `rebuild` (DESIGN.md §5) ---------------------------------------------------


@app.command()
def rebuild(ctx: typer.Context) -> None:
    """Drop every read model and rebuild it from the event log (with a progress bar)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with _ledger(ctx) as registry:
        columns = (
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=Console(stderr=True)) as bar:
            task = bar.add_task("rebuilding read models", total=None)

            def progress(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            applied = registry.rebuild(progress=progress)
    sys.stdout.write(f"rebuilt the read models from {applied} events\n")


# -- supervising: `run`, `ps`, `show`, `feed`, `stop`, `restore` (DESIGN.md §8) ----------------
# `run` supervises one command as the
# host's CLI owner (`procledger-cli@<host id>`, a fresh incarnation per run) and publishes its
# completion into the CLI's own notification session, so `restore` can republish it -- same
# command id -- for a run whose `procledger` died.

_CLI_NAMESPACE = uuid.UUID("0b7c5d2e-8a41-4c3f-9e6a-2f1d7b9c4a10")
_FEED_PAGE = 500
_FEED_POLL_S = 0.25
EXIT_STOPPED = 130
_StatusJson = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def _cli_owner() -> LeaseOwner:
    """This host's CLI owner, as a fresh incarnation (so `restore` can tell runs apart)."""
    identity = local_identity()
    host = identity.host_id if identity and identity.host_id else socket.gethostname()
    return LeaseOwner.local_process(f"procledger-cli@{host}")


def _cli_notifier(registry: ProcessRegistry, owner: LeaseOwner) -> tuple[Notifier, uuid.UUID]:
    """The CLI owner's notification session and its one loop (both derived from the owner id)."""
    from procledger.notifications import Notifier

    session_id = uuid.uuid5(_CLI_NAMESPACE, f"session:{owner.owner_id}")
    loop_id = uuid.uuid5(_CLI_NAMESPACE, f"loop:{owner.owner_id}")
    notifier = Notifier(registry, session_id)
    notifier.add_loop(loop_id)
    return notifier, loop_id


def _parse_signal(value: str) -> signal.Signals:
    name = value.strip().upper()
    try:
        if name.isdigit():
            return signal.Signals(int(name))
        return signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
    except (KeyError, ValueError):
        raise typer.BadParameter(f"{value!r} is not a signal name or number") from None


def _dump(model: Any) -> Any:
    return model.model_dump(mode="json")


def _write_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value).decode() + "\n")
    sys.stdout.flush()


def _console() -> Console:
    """Rich output for people; into a pipe, wide enough that ids are never folded."""
    from rich.console import Console

    return Console(highlight=False, width=None if sys.stdout.isatty() else 240)


def _table(*columns: str) -> Table:
    """A plain table whose columns never wrap, except the last (a command line) folds."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD)
    for column in columns[:-1]:
        table.add_column(column, no_wrap=True)
    table.add_column(columns[-1], overflow="fold")
    return table


def _when(ms: int | None) -> str:
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _outcome(record: ProcessRecord) -> str:
    if record.state is ProcessState.exited:
        return f"exit {record.exit_code}"
    return record.reason.value if record.reason else ""


def _command_text(record: ProcessRecord) -> str:
    argv = record.input.argv
    return shlex.join(argv) if argv else (record.identity.label or record.identity.kind)


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
    when a signal nobody asked for ended it (DESIGN.md §8)."""
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
    from procledger.supervisor.supervisor import Supervisor

    owner = _cli_owner()
    notifier, loop_id = _cli_notifier(registry, owner)
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


def _run_detached(
    ctx: typer.Context, command: list[str], *, grace: float, stop_signal: str, as_json: bool
) -> None:
    """`run --background`: a detached `procledger` (own session, no terminal) supervises the
    command; this one waits until it is recorded `backgrounded`, prints it and returns 0."""
    url = cli_state(ctx).url
    process_id = f"{int(time.time() * 1000):011x}-{uuid.uuid4().hex[:8]}"
    read_fd, write_fd = os.pipe()
    argv = [sys.executable, "-m", "procledger", *(["--url", url] if url else [])]
    argv += ["run", "--background", "--grace", str(grace), "--stop-signal", stop_signal]
    argv += ["--detached-fd", str(write_fd), "--process-id", process_id, "--", *command]
    try:
        with open(os.devnull, "rb") as null_in, open(os.devnull, "wb") as null_out:
            subprocess.Popen(
                argv,
                stdin=null_in,
                stdout=null_out,
                stderr=null_out,
                pass_fds=(write_fd,),
                start_new_session=True,
            )
    finally:
        os.close(write_fd)
    with os.fdopen(read_fd, "rb") as report:
        answer = report.read().decode(errors="replace").strip()
    if not answer.startswith("ok"):
        raise BackgroundStartError(answer or "the detached supervisor exited without a word")
    with _ledger(ctx) as registry:
        record = registry.get(process_id)
    if as_json:
        _write_json(_dump(record))
    else:
        sys.stdout.write(f"{record.id}\n")


class BackgroundStartError(ProcledgerError):
    """`run --background` could not start its detached supervisor or its command."""


def _detached_main(
    ctx: typer.Context, command: list[str], policy: StopPolicy, fd: int, process_id: str
) -> NoReturn:
    """The detached side of `run --background`: report on ``fd`` once the command runs."""
    report = os.fdopen(fd, "wb")

    def started(_handle: ProcessHandle) -> None:
        report.write(b"ok\n")
        report.close()

    try:
        with _ledger(ctx) as registry:
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
            report.write(f"{type(exc).__name__}: {_one_line(str(exc))}\n".encode())
            report.close()
        raise
    raise typer.Exit(exit_code)


@app.command(context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    command: Annotated[list[str], typer.Argument(metavar="-- CMD...", show_default=False)],
    *,
    background: Annotated[
        bool,
        typer.Option(
            "--background",
            help="Supervise it from a detached procledger (its output is discarded); print "
            "the process id once it runs and return 0.",
        ),
    ] = False,
    grace: Annotated[
        float,
        typer.Option("--grace", min=0.0, metavar="S", help="Seconds between stop signals."),
    ] = 10.0,
    stop_signal: Annotated[
        str,
        typer.Option(
            "--stop-signal",
            metavar="SIG",
            help="Sent after SIGINT's grace on Ctrl-C (then SIGKILL after another grace).",
        ),
    ] = "TERM",
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="Print the final record as JSON (the command's stdout goes to stderr)."
        ),
    ] = False,
    detached_fd: Annotated[int | None, typer.Option("--detached-fd", hidden=True)] = None,
    process_id: Annotated[str | None, typer.Option("--process-id", hidden=True)] = None,
) -> None:
    """Supervise a command: its output streams through, everything is recorded. First Ctrl-C
    stops its whole tree (SIGINT, --stop-signal, SIGKILL), a second kills it at once. Exits
    with the command's code, 130 if it was stopped on request, 128+N if signal N ended it."""
    from procledger.supervisor.execution import StopPolicy

    policy = StopPolicy((signal.SIGINT, _parse_signal(stop_signal)), grace)
    if detached_fd is not None and process_id is not None:
        _detached_main(ctx, command, policy, detached_fd, process_id)
    if background:
        _run_detached(ctx, command, grace=grace, stop_signal=stop_signal, as_json=as_json)
        return
    with _ledger(ctx) as registry:
        record, exit_code = _supervise(
            registry, command, policy=policy, background=False, as_json=as_json
        )
    if as_json:
        _write_json(_dump(record))
    elif exit_code and sys.stderr.isatty():
        sys.stderr.write(f"{PROG}: process {record.id} {record.state.value} ({_outcome(record)})\n")
    raise typer.Exit(exit_code)


@app.command()
def ps(
    ctx: typer.Context,
    *,
    show_all: Annotated[
        bool, typer.Option("--all", "-a", help="Every process, not only running ones.")
    ] = False,
    as_json: _StatusJson = False,
) -> None:
    """List processes (running ones unless --all), by id."""
    from procledger.projections.filters import ProcessListFilter

    with _ledger(ctx) as registry:
        records = registry.list_processes(
            ProcessListFilter(status="any" if show_all else "running")
        )
    if as_json:
        _write_json([_dump(record) for record in records])
        return
    table = _table("ID", "STATE", "STATUS", "OUTCOME", "UPDATED", "COMMAND")
    for record in records:
        table.add_row(
            record.id,
            record.state.value,
            record.status.value,
            _outcome(record),
            _when(record.updated_at_ms),
            _command_text(record),
        )
    _console().print(table)


@app.command()
def show(
    ctx: typer.Context,
    process_id: Annotated[str, typer.Argument(metavar="ID")],
    *,
    as_json: _StatusJson = False,
) -> None:
    """Show one process: its record and its whole event history."""
    from rich.table import Table

    with _ledger(ctx) as registry:
        record = registry.get(process_id)
        events = registry.events(process_id)
    if as_json:
        _write_json({"record": _dump(record), "events": [_dump(e) for e in events]})
        return
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column(overflow="fold")
    summary.add_row("id", record.id)
    summary.add_row("command", _command_text(record))
    summary.add_row("state", f"{record.state.value} ({record.status.value})")
    summary.add_row("outcome", _outcome(record))
    summary.add_row("disposition", record.disposition.value)
    if record.stop_requested:
        summary.add_row("stop requested", ", ".join(r.value for r in record.stop_requested))
    if record.first_started is not None:
        summary.add_row("first started by", record.first_started.owner.owner_id)
    if record.diagnostic:
        summary.add_row("diagnostic", record.diagnostic)
    history = _table("SEQ", "AT", "KIND", "DETAILS")
    for event in events:
        history.add_row(
            str(event.sequence), _when(event.occurred_at_ms), event.kind, _details(event)
        )
    console = _console()
    console.print(summary)
    console.print(history)


def _details(event: ProcessEvent) -> str:
    payload = event.payload if isinstance(event.payload, dict) else {}
    keys = ("state", "reason", "exit_code", "diagnostic")
    parts = [f"{k}={payload[k]}" for k in keys if payload.get(k) is not None]
    owner = payload.get("owner")
    if isinstance(owner, dict) and owner.get("owner_id"):
        parts.append(f"owner={owner['owner_id']}")
    return " ".join(parts)


@app.command()
def feed(
    ctx: typer.Context,
    *,
    since: Annotated[
        int, typer.Option("--since", min=0, metavar="N", help="Print changes after cursor N.")
    ] = 0,
    limit: Annotated[
        int | None,
        typer.Option("--limit", min=0, metavar="N", help="Print at most N changes, then exit."),
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing changes as they happen.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help='JSON lines: {"record": ..., "cursor": N}.')
    ] = False,
) -> None:
    """Print what changed after a cursor: one line per changed process, with its cursor."""
    with _ledger(ctx) as registry:
        try:
            _print_feed(registry, since, limit, follow=follow, as_json=as_json)
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_STOPPED) from None


def _print_feed(
    registry: ProcessRegistry, since: int, limit: int | None, *, follow: bool, as_json: bool
) -> None:
    from procledger.projections.feed import ChangeCursor

    cursor = ChangeCursor(since)
    left = limit
    while left is None or left > 0:
        page_size = _FEED_PAGE if left is None else min(left, _FEED_PAGE)
        records, cursor = registry.changes_since(cursor, page_size)
        for record in records:
            if as_json:
                _write_json({"record": _dump(record), "cursor": record.change_seq})
            else:
                line = f"{record.change_seq}\t{record.id}\t{record.state.value}\t{_outcome(record)}"
                sys.stdout.write(line + "\n")
        sys.stdout.flush()
        if left is not None:
            left -= len(records)
        if not records:
            if not follow:
                return
            time.sleep(_FEED_POLL_S)


@app.command()
def stop(
    ctx: typer.Context,
    process_id: Annotated[str, typer.Argument(metavar="ID")],
    *,
    mode: Annotated[
        StopMode,
        typer.Option(
            "--mode", help="interrupt: SIGINT first; terminate: SIGTERM first; kill: SIGKILL now."
        ),
    ] = StopMode.interrupt,
) -> None:
    """Record a stop request and return: the `procledger run` supervising the process carries
    it out with its own grace."""
    with _ledger(ctx) as registry:
        record = registry.get(process_id)
        if not record.state.is_terminal:
            record = registry.request_stop(process_id, mode.reason)
    if record.state.is_terminal:
        sys.stdout.write(f"process {record.id} already ended: {record.state.value}\n")
    else:
        sys.stdout.write(f"stop requested ({mode.reason.value}) for process {record.id}\n")


@app.command()
def restore(ctx: typer.Context, *, as_json: _StatusJson = False) -> None:
    """Record as lost every running process whose `procledger run` on this host is gone (its
    recorded pid is never signalled), and republish its completion notification."""
    from procledger.supervisor.supervisor import Supervisor

    with _ledger(ctx) as registry:
        owner = _cli_owner()
        notifier, _ = _cli_notifier(registry, owner)
        with Supervisor(registry, owner=owner, notifier=notifier) as supervisor:
            lost = supervisor.restore()
    if as_json:
        _write_json([_dump(record) for record in lost])
        return
    for record in lost:
        sys.stdout.write(f"{record.id}\t{record.state.value}\t{_command_text(record)}\n")
    sys.stdout.write(f"restored {len(lost)} process{'es' if len(lost) != 1 else ''}\n")
