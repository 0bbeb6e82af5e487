"""`procledger wait`: block until a process is ready or has ended (docs/design.md §15).

Exit codes, as a script wants them: 0 when the condition was reached; 1 when the process ended
before it was ready (``--until ready``) or ended unsuccessfully (``--until exit``); 124 when
``--timeout`` passed first, as timeout(1) does. For a service the newest attempt counts, and
an attempt that ended while another may follow is waited past. The waiting itself is the
registry's (``await_ready``, ``await_end``); this module only parses and reports.
"""

from __future__ import annotations

import sys
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Final

import typer

from procledger.cli._app import (
    JsonOption,
    cli_state,
    dump,
    open_ledger,
    option_errors,
    resolve_id,
    warn,
    warn_if_unowned,
    write_json,
)
from procledger.cli._format import ending

if TYPE_CHECKING:
    from procledger import ProcessRecord

EXIT_NOT_REACHED: Final = 1
EXIT_TIMEOUT: Final = 124
"""What timeout(1) exits with when the time ran out."""


class Until(StrEnum):
    ready = "ready"
    exit = "exit"


def wait(
    ctx: typer.Context,
    process_id: Annotated[
        str, typer.Argument(metavar="ID", help="A process id, or any unique prefix of one.")
    ],
    *,
    until: Annotated[
        Until,
        typer.Option("--until", help="ready: its readiness probes held; exit: it ended."),
    ] = Until.ready,
    timeout: Annotated[
        str | None,
        typer.Option(
            "--timeout",
            metavar="DURATION",
            show_default=False,
            help="Give up after this long (0.2s, 60s, 5m, 1h): exit 124.",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Wait until a process is ready, or has ended.

    Exits 0 when reached; 1 when it ended before it was ready (or, with --until exit, ended
    unsuccessfully); 124 on --timeout. A service is waited for through its attempts."""
    from procledger.domain.service import parse_duration

    with option_errors():
        seconds = None if timeout is None else parse_duration(timeout, option="--timeout")
    with open_ledger(cli_state(ctx).url, create=False, read_only=True) as registry:
        found = resolve_id(registry, process_id)
        warn_if_unowned(registry, found)
        waiting = registry.await_ready if until is Until.ready else registry.await_end
        try:
            record = waiting(found, timeout=seconds)
        except TimeoutError:
            warn(f"process {found} not {_goal(until)} after {timeout}")
            raise typer.Exit(EXIT_TIMEOUT) from None
    if as_json:
        write_json(dump(record))
    reached = _reached(record, until)
    if not reached:
        warn(f"process {record.id} {ending(record)}" + _before(until))
    elif not as_json:
        sys.stdout.write(f"{record.id}\t{_goal(until)}\n")
    raise typer.Exit(0 if reached else EXIT_NOT_REACHED)


def _reached(record: ProcessRecord, until: Until) -> bool:
    if until is Until.ready:
        return record.ready_at_ms is not None or not record.is_terminal
    return record.status.value == "completed"


def _goal(until: Until) -> str:
    return "ready" if until is Until.ready else "ended"


def _before(until: Until) -> str:
    return " before it was ready" if until is Until.ready else ""
