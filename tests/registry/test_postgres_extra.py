"""PostgreSQL support is an extra: without psycopg, opening a ``postgresql://`` ledger is one
clear ``StoreError`` saying what to install (a fresh process, where psycopg is made
unimportable)."""

from __future__ import annotations

from _shared import run_python

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
    ran = run_python(PROGRAM)
    assert ran.returncode == 0, ran.stderr
    assert "pip install 'procledger[postgres]'" in ran.stdout
    assert "secret" not in ran.stdout
    assert ran.stderr == ""
