"""Reading what can still be read of a damaged SQLite file (docs/design.md §7.3, "Damaged
files"): a table's rows in rowid order, stepping over the ranges that SQLite cannot read, and
which table each damaged page belongs to.

SQLite stops a statement at the first page it cannot read ("database disk image is
malformed"), so a plain read of a table with one bad page returns nothing. A rowid table is
read here from its first rowid on; where the read fails, the next rowid a seek can reach is
found (a seek goes down the b-tree to its leaf and so steps over a bad leaf that lies before
it): doubling the step until a seek succeeds, then halving back to the first one that does.
A bad page costs a few dozen statements, and every row on a good page is read.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence
from typing import Any, NamedTuple

from procledger.adapters.sql.sqlite_files import is_damage
from procledger.adapters.sql.store import Tx

LOWEST_ROWID = -(2**63)
HIGHEST_ROWID = 2**63 - 1


class Salvaged(NamedTuple):
    """The rows that could be read, in rowid order, and the rowid ranges that could not
    (``(first, last)``, ``last`` ``None``: to the end)."""

    rows: list[Any]
    unreadable: list[tuple[int, int | None]]


def readable_rows(
    tx: Tx, table: str, columns: str, keep: str = "1", params: Sequence[Any] = ()
) -> Salvaged:
    """The rows of rowid table ``table`` (``columns``, a SELECT list) for which ``keep`` (a
    condition, with ``params``) holds, skipping what cannot be read."""
    rows: list[Any] = []
    unreadable: list[tuple[int, int | None]] = []
    start = LOWEST_ROWID
    while True:
        last, failed = _scan(tx, (table, columns, keep, params), start, rows)
        if not failed:
            return Salvaged(rows, unreadable)
        gap = start if last is None else last + 1
        resume = _next_readable(tx, table, gap)
        if resume is None:
            unreadable.append((gap, None))
            return Salvaged(rows, unreadable)
        unreadable.append((gap, resume - 1))
        start = resume


def _scan(
    tx: Tx, query: tuple[str, str, str, Sequence[Any]], start: int, into: list[Any]
) -> tuple[int | None, bool]:
    """Read from rowid ``start`` on into ``into`` until the end (``False``) or a page that
    cannot be read (``True``); the last rowid read either way."""
    table, columns, keep, params = query
    cursor = tx.cursor.connection.cursor()
    last: int | None = None
    try:
        cursor.execute(
            f"SELECT rowid AS salvaged_rowid, ({keep}) AS salvaged_keep, {columns} "
            f"FROM {table} WHERE rowid>=? ORDER BY rowid",
            (*params, start),
        )
        for row in cursor:
            last = row[0]
            if row[1]:
                into.append(row)
    except sqlite3.DatabaseError as error:
        if not is_damage(error):
            raise
        return last, True
    finally:
        cursor.close()
    return last, False


def _next_readable(tx: Tx, table: str, gap: int) -> int | None:
    """The first rowid at or after ``gap`` from which a read succeeds, or ``None`` when no
    row after it can be read (or there is none)."""
    failing, step = gap, 1
    while True:
        probe = min(gap + step, HIGHEST_ROWID)
        found = _seek(tx, table, probe)
        if found is not None:
            break
        if probe == HIGHEST_ROWID:
            return None
        failing, step = probe, step * 2
    reached, succeeding = found, probe
    while succeeding - failing > 1:  # the first probe that succeeds, between the two
        middle = (failing + succeeding) // 2
        at = _seek(tx, table, middle)
        if at is None:
            failing = middle
        else:
            reached, succeeding = at, middle
    return None if reached is _END else int(reached)


_END: Any = object()
"""What ``_seek`` finds past the last row."""


def _seek(tx: Tx, table: str, rowid: int) -> Any:
    """The first rowid at or after ``rowid``, ``_END`` when there is none, ``None`` when the
    seek meets a page that cannot be read."""
    try:
        row = tx.execute(
            f"SELECT rowid FROM {table} WHERE rowid>=? ORDER BY rowid LIMIT 1", (rowid,)
        ).one()
    except sqlite3.DatabaseError as error:
        if not is_damage(error):
            raise
        return None
    return _END if row is None else row[0]


def describe_unreadable(table: str, ranges: Sequence[tuple[int, int | None]]) -> list[str]:
    """One line per range of rows of ``table`` that could not be read."""
    lines = []
    for first, last in ranges:
        since = "its first row" if first == LOWEST_ROWID else f"rowid {first}"
        until = "its end" if last is None else f"rowid {last}"
        lines.append(f"the rows of {table} from {since} to {until} could not be read")
    return lines


_PAGE = re.compile(r"\bpage (\d+)", re.IGNORECASE)


def damaged_trees(tx: Tx, problems: Sequence[str]) -> dict[str, list[int]]:
    """The tables (``"table t"``) and indexes (``"index i of table t"``) with damaged pages,
    each with those pages: the pages SQLite's integrity check names in ``problems``, and the
    pages ``dbstat`` -- which walks every b-tree -- finds it cannot read (the check itself
    may stop at the first of those); empty where ``dbstat`` cannot say."""
    pages = sorted({int(number) for line in problems for number in _PAGE.findall(line)})
    try:
        owners = tx.execute(
            "SELECT d.name AS tree, d.pageno AS page, m.type AS type, m.tbl_name AS of "
            "FROM dbstat AS d LEFT JOIN sqlite_master AS m ON m.name = d.name "
            f"WHERE d.pagetype='corrupted' OR d.pageno IN ({','.join('?' * len(pages))})",
            pages,
        ).all()
    except sqlite3.Error:
        return {}
    trees: dict[str, set[int]] = {}
    for row in owners:
        name = f"table {row['tree']}"
        if row["type"] == "index":
            name = f"index {row['tree']} of table {row['of']}"
        trees.setdefault(name, set()).add(int(row["page"]))
    return {name: sorted(found) for name, found in sorted(trees.items())}
