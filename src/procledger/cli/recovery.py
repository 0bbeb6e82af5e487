"""Recovery from the command line: `sweep [--drain]` and `worker` (docs/design.md §3.6).

Both run the recovery worker on a thread, so Ctrl-C (SIGINT) and SIGTERM reach the main thread
as exceptions, never inside a lock; the main thread then calls ``RecoveryWorker.stop()`` --
running attempts are cancelled, their trees stopped -- waits for the thread, prints what was
done, and exits 130 (SIGINT) or 143 (SIGTERM).
"""

from __future__ import annotations

import importlib
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import typer

from procledger.adapters.proc_facts import host_id
from procledger.cli._app import cli_state, open_ledger
from procledger.cli.values import MAX_GRACE_S

if TYPE_CHECKING:
    from procledger import LeaseOwner, LeaseTimings, ProcessRegistry, RecoveryWorker, SweepReport
    from procledger.recovery import Engine

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
    int,
    typer.Option(
        "--ttl-ms", min=1, metavar="MS", help="Lease time to live (at least 3 x --renew-ms)."
    ),
]
_RenewOption = Annotated[
    int,
    typer.Option(
        "--renew-ms", min=1, metavar="MS", help="How often a running attempt renews its lease."
    ),
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
    """SIGTERM turned into an exception, so the main thread leaves its wait like on Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


def _raise_stop_signal(signum: int, _frame: object) -> None:
    raise _StopSignal(signum)


def _load_engine(spec: str) -> tuple[str, Engine]:
    """``--engine KIND=MODULE:CALLABLE``: a bad spec is a usage error (exit 2), found before
    any store is opened."""
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
        from procledger import LeaseOwner, LeaseTimings

        try:
            timings = LeaseTimings(ttl_ms=ttl_ms, renew_ms=renew_ms)
        except ValueError:
            message = f"--ttl-ms ({ttl_ms}) must be at least 3 x --renew-ms ({renew_ms})"
            raise typer.BadParameter(message, param_hint="--ttl-ms") from None
        if owner_id is None:
            owner_id = f"procledger-worker@{host_id()}"
        engine_map = dict(_load_engine(spec) for spec in engines)
        return cls(LeaseOwner.local_process(owner_id), timings, engine_map)

    def worker(self, registry: ProcessRegistry) -> RecoveryWorker:
        from procledger import RecoveryWorker

        return RecoveryWorker(registry, self.owner, timings=self.timings, engines=self.engines)


def _print_report(report: SweepReport, as_json: bool) -> None:
    """Counts on one line, then the ids of everything that changed (skipped work did not)."""
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
    ctx: typer.Context,
    settings: _WorkerSettings,
    work: Callable[[RecoveryWorker], object],
    *,
    create: bool = True,
) -> int:
    """Open the store, run ``work`` with this command's recovery worker on a thread (see
    ``_run_worker_thread``) and close the store; the exit code. ``create=False`` (a one-off
    sweep) refuses a ledger that is not there, naming it, as `ps` does: a mistyped path must
    not become an empty ledger that then reports "nothing to recover"."""
    with open_ledger(cli_state(ctx).url, create=create) as registry:
        recovery = settings.worker(registry)
        return _run_worker_thread(recovery, lambda: work(recovery))


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
    """Run one recovery pass by declared disposition.

    Prints what was done: counts, then the ids of what changed."""
    settings = _WorkerSettings.parse(owner, ttl_ms, renew_ms, engine or ())
    reports: list[SweepReport] = []
    exit_code = _recover(
        ctx,
        settings,
        lambda recovery: reports.append(recovery.drain() if drain else recovery.sweep()),
        create=False,
    )
    for report in reports:
        _print_report(report, as_json)
    if exit_code:
        raise typer.Exit(exit_code)


def worker(
    ctx: typer.Context,
    *,
    interval: Annotated[
        float,
        typer.Option(
            "--interval",
            min=0.0,
            max=MAX_GRACE_S,
            metavar="SECONDS",
            help="Seconds to wait between sweeps.",
        ),
    ] = 1.0,
    max_sweeps: Annotated[
        int | None,
        typer.Option("--max-sweeps", min=1, metavar="N", help="Exit 0 after this many sweeps."),
    ] = None,
    owner: _OwnerOption = None,
    ttl_ms: _TtlOption = 30_000,
    renew_ms: _RenewOption = 10_000,
    engine: _EngineOption = None,
    as_json: _JsonOption = False,
) -> None:
    """Sweep repeatedly, running recoverable work.

    Sweep, wait, repeat until Ctrl-C (exit 130) or SIGTERM (exit 143). Prints a report after
    each sweep that did something (--json: after each)."""
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
