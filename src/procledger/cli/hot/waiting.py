"""`procledger wait`: block until a process is ready or has ended (docs/design.md §15).

Exit codes, as a script wants them: 0 when the condition was reached; 1 when the process ended
before it was ready (``--until ready``) or ended unsuccessfully (``--until exit``); 124 when
``--timeout`` passed first, as timeout(1) does. For a service the newest attempt counts, and an
attempt that ended while another may follow is waited past. What is already decided is read as
stored (the fast path); anything to wait for is the registry's (``await_ready``, ``await_end``).
"""

from __future__ import annotations

from argparse import Namespace
from typing import Any, Final

from procledger.application.document_reads import Document, NeedsFullPath
from procledger.cli.hot import marks as marking
from procledger.cli.hot.opening import reading
from procledger.cli.hot.showing import resolve
from procledger.cli.lines import warn, write_json, write_line
from procledger.cli.values import UsageError
from procledger.domain.wording import ending

__all__ = ["wait"]

EXIT_NOT_REACHED: Final = 1
EXIT_TIMEOUT: Final = 124
"""What timeout(1) exits with when the time ran out."""


def wait(options: Namespace, url: str | None, *, fast: bool) -> int:
    seconds = _timeout(options.timeout)
    ready = options.until == "ready"
    if fast:
        with reading(url, fast=True) as reads:
            record = reads.newest_attempt(resolve(reads, options.process_id))
        if not _decided(record, ready):
            raise NeedsFullPath  # to be waited for: the registry's waits
        return _report(record, options)
    with reading(url, fast=False) as reads:
        found = resolve(reads, options.process_id)
        marking.warn_if_unowned(reads, reads.record(found))
        return _await(reads.registry, found, seconds, options)


def _timeout(text: str | None) -> float | None:
    if text is None:
        return None
    from procledger.domain.durations import parse_duration
    from procledger.domain.errors import OptionError

    try:
        return parse_duration(text, option="--timeout")
    except OptionError as error:
        raise UsageError(str(error).removeprefix("--timeout: "), "--timeout") from None


def _decided(record: Document, ready: bool) -> bool:
    """Whether the answer is already in the record: ready (for ``--until ready``), or ended
    with no attempt to follow (no restart policy, or given up)."""
    if ready and record.get("ready_at_ms") is not None:
        return True
    final = record.get("restart") is None or record.get("gave_up") is not None
    return marking.is_terminal(record) and final


def _await(registry: Any, found: str, seconds: float | None, options: Namespace) -> int:
    """The registry's wait (the full path's reads hold it open already)."""
    waiting: Any = registry.await_ready if options.until == "ready" else registry.await_end
    try:
        record = waiting(found, timeout=seconds).model_dump(mode="json")
    except TimeoutError:
        warn(f"process {found} not {_goal(options.until)} after {options.timeout}")
        return EXIT_TIMEOUT
    return _report(record, options)


def _report(record: Document, options: Namespace) -> int:
    if options.as_json:
        write_json(record)
    if options.until == "ready":
        reached = record.get("ready_at_ms") is not None or not marking.is_terminal(record)
    else:
        reached = record["status"] == "completed"
    if not reached:
        before = " before it was ready" if options.until == "ready" else ""
        warn(f"process {record['id']} {ending(record)}{before}")
    elif not options.as_json:
        write_line(f"{record['id']}\t{_goal(options.until)}")
    return 0 if reached else EXIT_NOT_REACHED


def _goal(until: str) -> str:
    return "ready" if until == "ready" else "ended"
