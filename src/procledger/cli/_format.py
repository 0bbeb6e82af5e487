"""Output for people: aligned columns cut to the terminal, local times, a process's outcome and
its command line on one line.

Plain string formatting, not rich: `ps` lists thousands of records in a few milliseconds, and
into a pipe it writes tab-separated columns with nothing padded or cut (docs/design.md §8).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from datetime import datetime

from procledger.domain.wording import command_text, ending, local_time, outcome, shell_word

__all__ = [
    "command_text",
    "cut",
    "ending",
    "local_time",
    "outcome",
    "shell_word",
    "short_time",
    "to_terminal",
    "write_table",
]


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
