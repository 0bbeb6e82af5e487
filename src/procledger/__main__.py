"""``python -m procledger`` and the ``procledger`` script: answer ``--version`` before importing
anything, otherwise run the CLI (docs/design.md §8).

``procledger --version`` is what a person or a script types to check an install; it must not pay
for typer, pydantic and the stores (docs/design.md §1.2, cheap start-up), so it is answered here,
with the one version constant of ``procledger``, before ``procledger.cli`` is imported.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``procledger`` script."""
    _discard_closed_streams()
    args = list(sys.argv[1:] if argv is None else argv)
    if args in (["--version"], ["-V"]):
        import procledger  # noqa: PLC0415 -- nothing else is imported

        sys.stdout.write(f"procledger {procledger.__version__}\n")
        sys.stdout.flush()
        raise SystemExit(0)
    from procledger.cli.entry import main as cli_main  # noqa: PLC0415 -- not for --version

    cli_main(args)


def _discard_closed_streams() -> None:
    """A caller that closed our stdout or stderr (``procledger run --json -- true >&-``) gets
    what a closed stream gets -- nothing -- instead of a traceback from writing to ``None``
    (Python sets ``sys.stdout`` to ``None`` when descriptor 1 is closed at start-up)."""
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w"))  # noqa: SIM115 -- for the process's life


if __name__ == "__main__":
    main()
