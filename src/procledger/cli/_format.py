"""Output for people: aligned columns cut to the terminal, local times, a process's outcome and
its command line on one line.

Plain string formatting, not rich: `ps` lists thousands of records in a few milliseconds, and
into a pipe it writes tab-separated columns with nothing padded or cut (docs/design.md §8).
"""

from __future__ import annotations

import shlex
import shutil
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from procledger import ProcessState

if TYPE_CHECKING:
    from procledger import ProcessRecord

_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\", "'": "\\'"}


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


def local_time(ms: int | None) -> str:
    """The ledger keeps UTC milliseconds; people read their own time zone, to the second."""
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def outcome(record: ProcessRecord) -> str:
    """The exit code when the process exited by itself, otherwise why it ended (if it did),
    with the signal that ended it."""
    if record.state is ProcessState.exited:
        return f"exit {record.exit_code}"
    text = record.reason.value if record.reason else ""
    signal = getattr(record, "signal", None)
    return f"{text} (signal {signal})" if signal else text


def ending(record: ProcessRecord) -> str:
    """How the process ended in a few words: ``exited (exit 3)``, ``terminated (signal 15)``,
    ``lost_on_restore``."""
    signal = getattr(record, "signal", None)
    if record.state is ProcessState.exited:
        return f"exited (exit {record.exit_code})"
    return record.state.value + (f" (signal {signal})" if signal else "")


def shell_word(word: str) -> str:
    """One word as a shell reads it, always on one line: control characters are written as
    ``$'...'`` escapes (so an argv with newlines is still one line), the rest as shlex does."""
    if word.isprintable():
        return shlex.quote(word)
    escaped = "".join(_ESCAPES.get(ch) or (ch if ch.isprintable() else _hex(ch)) for ch in word)
    return f"$'{escaped}'"


def _hex(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def command_text(record: ProcessRecord) -> str:
    """A command line a shell would accept, on one line; work without argv shows its label or
    kind."""
    argv = record.input.argv
    if not argv:
        return record.identity.label or record.identity.kind
    return " ".join(shell_word(word) for word in argv)
