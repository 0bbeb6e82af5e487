"""The ``procledger`` command's entry: the hot commands answered on the fast path, everything
else handed to the full CLI (docs/design.md §8.1).

``procledger [--url URL] COMMAND ...``: when COMMAND is a hot one (``cli.table``) its words are
parsed by the table's parser and it runs over ``LedgerReads`` opened by the standard library
(a SQLite file) -- or, where that cannot serve (PostgreSQL, ``memory://``, an older schema,
a damaged row), over the registry; ``PROCLEDGER_FAST=0`` takes the full path always. Anything
else (``--help``, another command, a global option this entry does not know) goes to the typer
app with the words untouched. Either way a failure is one line on stderr and an exit code.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from procledger.cli.dispatch import run_hot
from procledger.cli.lines import URL_VARIABLE, is_utf8
from procledger.cli.table import find

__all__ = ["FAST_VARIABLE", "main"]

FAST_VARIABLE = "PROCLEDGER_FAST"
"""``0`` sends the hot commands down the full path (a check, or a way round a fast-path bug)."""


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``procledger`` script."""
    args = list(sys.argv[1:] if argv is None else argv)
    url, rest = _global_options(args)
    hot = None if rest is None else find(rest)
    if hot is None:
        from procledger.cli.full import main as full_main

        full_main(args)
        return
    spec, words = hot
    run_hot(spec, words, url, fast=os.environ.get(FAST_VARIABLE, "1") != "0")


def _global_options(args: list[str]) -> tuple[str | None, list[str] | None]:
    """``--url URL`` (or ``--url=URL``, else ``$PROCLEDGER_URL``) and the words after the
    global options; ``None`` for words only the full CLI reads (``--help``, ``--version``,
    a missing or non-UTF-8 URL)."""
    url = os.environ.get(URL_VARIABLE)
    index = 0
    while index < len(args) and args[index].startswith("--url"):
        if args[index] == "--url" and index + 1 < len(args):
            url, index = args[index + 1], index + 2
        elif args[index].startswith("--url="):
            url, index = args[index].removeprefix("--url="), index + 1
        else:
            return None, None
    if url is not None and not is_utf8(url):
        return None, None
    return (url or None), args[index:]
