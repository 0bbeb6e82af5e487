"""What a reader of the SQLite ledger built on the standard library shares with the store
(docs/design.md §1.2, §7.3, §13.5): ``sqlite_files`` (the read-only connection) and ``damage``
(when a process is damaged) import the standard library, orjson and procledger's errors only,
so the CLI's fast read path can call them without loading pydantic or eventsourcing."""

from __future__ import annotations

import orjson

from _shared import run_python

HEAVY = ("pydantic", "eventsourcing", "psycopg", "typer", "rich", "anyio")


def test_the_shared_modules_load_nothing_heavy() -> None:
    code = (
        "import sys, orjson\n"
        "import procledger.adapters.sql.sqlite_files, procledger.adapters.sql.damage\n"
        "print(orjson.dumps(sorted({name.split('.')[0] for name in sys.modules})).decode())"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    loaded = set(orjson.loads(done.stdout))
    assert not loaded & set(HEAVY), loaded & set(HEAVY)
