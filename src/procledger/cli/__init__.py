"""The ``procledger`` command (docs/design.md §8).

- ``entry``: ``main``, the entry -- the hot commands on the fast path, the rest to ``full``.
- ``table``, ``parsing``, ``values``: the hot commands, each defined once, and their parser.
- ``hot``: the hot commands' bodies over ``LedgerReads`` (docs/design.md §8.1).
- ``lines``: what every command writes (stdout data, the stderr line, exit codes).
- ``full``: the typer app with every command (``--help``, the other commands).

This package imports nothing at all: the fast path must not pay for typer. ``app``,
``CliState`` and ``main`` are found on first use.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from procledger.cli._app import CliState
    from procledger.cli.entry import main
    from procledger.cli.full import app
    from procledger.domain.lifecycle_table import render_markdown, render_mermaid

_WHERE = {
    "main": "procledger.cli.entry",
    "app": "procledger.cli.full",
    "CliState": "procledger.cli._app",
    "render_markdown": "procledger.domain.lifecycle_table",
    "render_mermaid": "procledger.domain.lifecycle_table",
}


def __getattr__(name: str) -> Any:
    """The package's names, imported on first use. ``render_markdown``/``render_mermaid``:
    `table` renders through these names, so that they can be replaced here (see `table`)."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_WHERE[name]), name)


__all__ = ["CliState", "app", "main", "render_markdown", "render_mermaid"]
