"""Output for people: aligned columns cut to the terminal, local times, a process's outcome and
its command line on one line.

Plain string formatting, not rich: `ps` lists thousands of records in a few milliseconds, and
into a pipe it writes tab-separated columns with nothing padded or cut (docs/design.md §8).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from procledger.domain.wording import (
    command_text,
    ending,
    local_time,
    outcome,
    shell_word,
    shown_state,
)

__all__ = [
    "command_text",
    "cut",
    "ending",
    "local_time",
    "outcome",
    "shell_word",
    "short_id",
    "short_time",
    "state_text",
    "to_terminal",
    "when",
    "write_table",
]


def short_id(process_id: str) -> str:
    """The id as ``ps`` shows it on a terminal: the random part of a minted id (with a
    service attempt's ``.N``), which ``id_prefix.resolve`` accepts back; any other id whole."""
    time_part, dash, rest = process_id.partition("-")
    minted = dash and len(time_part) == 11 and all(c in "0123456789abcdef" for c in time_part)
    return rest if minted and rest else process_id


def state_text(record: Mapping[str, Any], mark: str | None, now_ms: int | None = None) -> str:
    """A record's state, with what this host sees of it beyond the record (``supervisor
    gone``, ``orphan running``); given ``now_ms``, a service's attempt waiting out its backoff
    is ``backoff`` (``wording.shown_state``)."""
    state = record["state"] if now_ms is None else shown_state(record, now_ms)
    return state if mark is None else f"{state} ({mark})"


def when(ms: int | None, terminal: bool) -> str:
    """A list's time column: short on a terminal, whole into a pipe."""
    return short_time(ms) if terminal else local_time(ms)


def to_terminal() -> bool:
    """Whether stdout is a person's terminal (aligned, cut to its width) or a pipe (plain)."""
    return sys.stdout.isatty()


def write_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Columns under ``header``. On a terminal: aligned, the last column (a command line) cut
    to the terminal's width with ``…``, never the others. Into a pipe: tab-separated, whole."""
    if not to_terminal():
        lines = ["\t".join(header), *("\t".join(row) for row in rows)]
        sys.stdout.write("\n".join(lines) + "\n")
        return
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    room = shutil.get_terminal_size().columns - sum(widths) - 2 * len(widths)
    out = []
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        out.append("  ".join([*cells, cut(row[-1], room)]).rstrip())
    sys.stdout.write("\n".join(out) + "\n")


def cut(text: str, room: int) -> str:
    """``text`` in at most ``room`` characters (at least one), ending in ``…`` when cut."""
    room = max(room, 1)
    return text if len(text) <= room else text[: room - 1] + "…"


def short_time(ms: int | None, now: datetime | None = None) -> str:
    """``local_time`` as a column a person scans at a terminal, as ps(1) and ls(1) do: the time
    alone for today, the day and minute this year, the date before that. Eleven characters
    at most, where the full form takes nineteen: on an 80-column terminal those are the
    command line's (into a pipe, ``ps`` writes the full form)."""
    if ms is None:
        return ""
    when = datetime.fromtimestamp(ms / 1000)
    today = (now or datetime.now()).date()
    if when.date() == today:
        return when.strftime("%H:%M:%S")
    return when.strftime("%m-%d %H:%M" if when.year == today.year else "%Y-%m-%d")
