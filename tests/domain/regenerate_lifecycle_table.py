"""Rewrite the generated block of ``src/procledger/domain/lifecycle_table.py`` from the machine
in ``domain/lifecycle.py`` (docs/design.md §2.2). Run after changing the machine:

    .venv/bin/python tests/domain/regenerate_lifecycle_table.py

The domain does no I/O, so the writing lives here; ``test_lifecycle.py`` fails until it ran.
"""

from __future__ import annotations

from pathlib import Path

import procledger.domain.lifecycle_table
from procledger.domain.lifecycle import replace_table_block


def main() -> None:
    path = Path(procledger.domain.lifecycle_table.__file__)
    text = path.read_text(encoding="utf-8")
    updated = replace_table_block(text)
    if updated != text:
        path.write_text(updated, encoding="utf-8")
    print(f"{path}: {'rewritten' if updated != text else 'already current'}")


if __name__ == "__main__":
    main()
