"""PostgreSQL support is an extra: without psycopg, opening a ``postgresql://`` ledger is one
clear ``StoreError`` saying what to install (a fresh process, where psycopg is made
unimportable)."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import sys
sys.modules["psycopg"] = None  # as if the extra were not installed
from procledger import StoreError, open_registry
try:
    open_registry("postgresql://u:secret@127.0.0.1:1/db")
except StoreError as error:
    print(type(error).__name__, error)
"""


def test_a_missing_driver_names_the_extra() -> None:
    ran = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60, check=True
    )
    assert "pip install 'procledger[postgres]'" in ran.stdout
    assert "secret" not in ran.stdout
    assert ran.stderr == ""
