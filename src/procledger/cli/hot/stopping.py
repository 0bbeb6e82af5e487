"""`stop`: what has ended is said from the records as stored; a stop to carry out is the full
path's (``cli.control.stop_here``), which records it and tells the agent (docs/design.md §8,
§8.1)."""

from __future__ import annotations

from argparse import Namespace

from procledger.cli.hot import marks as marking
from procledger.cli.hot.opening import reading
from procledger.cli.hot.showing import resolve
from procledger.cli.lines import write_json, write_line

__all__ = ["stop"]


def stop(options: Namespace, url: str | None, *, fast: bool) -> int:
    if fast:
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

    return stop_here(options, url)
