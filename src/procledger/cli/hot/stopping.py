"""`stop`: what has ended is said from the records as stored; a stop to carry out is the full
path's (``cli.control.stop_here``), which records it and tells the agent (docs/design.md §8,
§8.1) -- and so is ``stop :PORT``, which looks for the process holding a port (§19)."""

from __future__ import annotations

from argparse import Namespace

from procledger.cli.hot import marks as marking
from procledger.cli.hot.opening import reading
from procledger.cli.hot.showing import resolve
from procledger.cli.lines import write_json, write_line
from procledger.cli.values import UsageError

__all__ = ["stop", "target_port"]


def stop(options: Namespace, url: str | None, *, fast: bool) -> int:
    port = target_port(options.process_id)
    if fast and port is None:
        with reading(url, fast=True) as reads:
            record = reads.record(resolve(reads, options.process_id))
        ended = marking.is_terminal(record) and not marking.orphan_running(record)
        if ended and record.get("attempt") is None:
            if options.as_json:
                write_json(record)
            else:
                write_line(f"process {record['id']} already ended: {record['state']}")
            return 0
    from procledger.cli.control import stop_here

    return stop_here(options, url, port)


def target_port(text: str) -> int | None:
    """The port ``:PORT`` names (docs/design.md §19: the process holding it on this host, a
    full-path stop); ``None`` for an id or a name, which never begins with ``:``.

    Raises:
        UsageError: ``:`` followed by anything but a port from 1 to 65535.
    """
    if not text.startswith(":"):
        return None
    digits = text[1:]
    if digits.isascii() and digits.isdigit() and len(digits) <= 5 and 1 <= int(digits) <= 65535:
        return int(digits)
    raise UsageError(f"{text!r} names no port (:PORT takes a port from 1 to 65535)", "ID")
