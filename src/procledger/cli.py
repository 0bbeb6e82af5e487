"""The ``procledger`` command: ``procledger [--url URL] COMMAND ...`` (DESIGN.md §8).

How to add a command: decorate a function with ``@app.command()``, take ``ctx: typer.Context``
when it needs the global options (``cli_state(ctx).url``), and let library errors propagate.
``main`` is the one place that turns a ``ProcledgerError`` or ``OSError`` into exactly one line
on stderr and exit code 1; usage errors exit 2 (typer/click's own handling). Machine output goes
to stdout as plain text; nothing here opens a store unless the command needs one.
"""

from __future__ import annotations

import importlib
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, NoReturn

import typer

from procledger.adapters.liveness import local_identity
from procledger.domain.errors import ProcledgerError
from procledger.domain.leases import LeaseOwner, LeaseTimings
from procledger.domain.lifecycle import render_markdown, render_mermaid
from procledger.recovery import Engine, RecoveryWorker, SweepReport
from procledger.registry import ProcessRegistry, open_registry

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


def _run_worker_thread(worker: RecoveryWorker, body: Callable[[], None]) -> int:
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
    registry = open_registry(cli_state(ctx).url)
    reports: list[SweepReport] = []
    try:
        recovery = settings.worker(registry)
        run = recovery.drain if drain else recovery.sweep
        exit_code = _run_worker_thread(recovery, lambda: reports.append(run()))
    finally:
        registry.close()
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
    registry = open_registry(cli_state(ctx).url)
    try:
        recovery = settings.worker(registry)

        def on_report(report: SweepReport) -> None:
            busy = any(getattr(report, name) for name in _REPORT_FIELDS if name != "skipped")
            if as_json or busy:
                _print_report(report, as_json)

        def body() -> None:
            recovery.serve(interval_s=interval, max_sweeps=max_sweeps, on_report=on_report)

        exit_code = _run_worker_thread(recovery, body)
    finally:
        registry.close()
    if exit_code:
        raise typer.Exit(exit_code)


# -- projections: `rebuild` (DESIGN.md §5) ---------------------------------------------------
# Self-contained: the projections issue owns this function.


@app.command()
def rebuild(ctx: typer.Context) -> None:
    """Drop every read model and rebuild it from the event log (with a progress bar)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from procledger.registry import open_registry as open_ledger

    registry = open_ledger(cli_state(ctx).url)
    try:
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
    finally:
        registry.close()
    sys.stdout.write(f"rebuilt the read models from {applied} events\n")
