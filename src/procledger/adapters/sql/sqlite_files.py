"""A SQLite ledger file as the standard library sees it: a read-only connection that works
where SQLite cannot write (an archived folder, a read-only mount), why a writer cannot use a
folder, and what SQLite's errors say about the file.

Standard library only, and ``procledger.domain.errors``: the CLI's fast read path opens the
ledger with these functions without loading pydantic or eventsourcing, and so comes to the
same conclusions as the store (docs/design.md §7.3, "Read-only folders").
"""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path
from typing import Any
from urllib.parse import quote

from procledger.domain.errors import (
    StoreCorrupt,
    StoreError,
    StoreReadOnly,
    StoreUnavailable,
    StoreURLError,
)

__all__ = [
    "CHECKED_BYTES",
    "connect_read_only",
    "damaged_file",
    "is_damage",
    "leave_mark",
    "mark_of",
    "refuse_if_damaged",
    "sqlite_error",
    "why_not_writable",
]

_CANNOT_MAKE_INDEX = frozenset(
    {
        "SQLITE_CANTOPEN",
        "SQLITE_READONLY",
        "SQLITE_READONLY_CANTINIT",
        "SQLITE_READONLY_CANTLOCK",
        "SQLITE_READONLY_DIRECTORY",
        "SQLITE_READONLY_RECOVERY",
    }
)
"""What SQLite answers a reader that cannot open or create the ``-shm`` file (the index of
the write-ahead log) beside the ledger."""


def connect_read_only(path: str | os.PathLike[str], **options: Any) -> sqlite3.Connection:
    """A connection that only reads the SQLite ledger at ``path``, probed with one read, so
    whatever stops SQLite is raised here, with the reason. ``options`` go to
    ``sqlite3.connect`` (``timeout``, ``check_same_thread``, ``isolation_level`` ...).

    Where SQLite can write beside the file, an ordinary connection with ``query_only`` set: it
    refuses every write, and like any connection it makes the ``-wal`` and ``-shm`` files
    while open and removes them when it closes last, so the folder is left as found (a
    ``mode=ro`` connection would leave them behind). Where it cannot -- a folder this user
    cannot write, a read-only mount -- ``mode=ro``, which works when the ``-shm`` index is
    already there; otherwise, when the write-ahead log holds nothing (no ``-wal``, or an
    empty one), ``immutable=1``: the file alone is the whole ledger, and nothing can change
    it while its folder stays unwritable (a writer would need to make the ``-wal`` there).
    A ledger whose log holds commits not yet copied into the file cannot be read there
    without the index: that is ``StoreReadOnly``, saying so.

    Raises:
        StoreURLError: there is no file at ``path``.
        StoreReadOnly: the folder cannot be written and the ledger's write-ahead log was not
            checkpointed (the message names both, and the way forward).
        StoreCorrupt: the file is not a SQLite database, or is damaged.
        StoreError: anything else that stops SQLite, naming the file.
    """
    file = Path(os.path.abspath(path))
    if not file.is_file():
        raise StoreURLError(f"no ledger at {file} (nothing was created)")
    if not os.access(file, os.R_OK):
        raise StoreError(f"cannot read the ledger {file} ({_who_may(file)})")
    at = f"file:{quote(str(file))}"
    try:
        if _writable(file.parent):
            return _probed(at, options, query_only=True)
        try:
            return _probed(f"{at}?mode=ro", options)
        except sqlite3.Error as error:
            if not _index_refused(error):
                raise
        why = _unreadable_here(file)
        if why is not None:
            raise StoreReadOnly(why)
        return _probed(f"{at}?immutable=1", options)
    except sqlite3.Error as error:
        if is_damage(error):
            raise damaged_file(file, _first_line(error)) from error
        raise sqlite_error(error, f"ledger {file}: {_first_line(error)}") from error


def _probed(uri: str, options: dict[str, Any], *, query_only: bool = False) -> sqlite3.Connection:
    """A connection to ``uri`` that has read once (SQLite opens the ``-wal`` and ``-shm``
    files only when a statement first reads), refusing writes with ``query_only``."""
    connection: sqlite3.Connection = sqlite3.connect(uri, uri=True, **options)
    try:
        if query_only:
            connection.execute("PRAGMA query_only=1")
        connection.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
    except BaseException:
        connection.close()
        raise
    return connection


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def _index_refused(error: sqlite3.Error) -> bool:
    return getattr(error, "sqlite_errorname", "") in _CANNOT_MAKE_INDEX


def _unreadable_here(file: Path) -> str | None:
    """Why SQLite cannot read ``file`` in its unwritable folder, or ``None`` when the file
    alone holds the whole ledger (no write-ahead log, or an empty one)."""
    wal = Path(f"{file}-wal")
    try:
        held = wal.stat().st_size
    except OSError:
        return None
    if held == 0:
        return None
    shm = Path(f"{file}-shm")
    index = "its index is unreadable" if shm.exists() else f"there is no {shm.name} index"
    return (
        f"{_folder_state(file.parent)}, and the ledger {file} has a write-ahead log that was "
        f"not checkpointed ({wal.name}, {held} bytes) while {index}: SQLite can read that log "
        f"only through {shm.name}, which it cannot make there. Read a copy of the folder made "
        f"somewhere writable, or let someone who can write to {file.parent} checkpoint it "
        f"(sqlite3 {file} 'PRAGMA wal_checkpoint(TRUNCATE)')"
    )


def why_not_writable(path: str | os.PathLike[str]) -> str | None:
    """Why a writer cannot use the ledger at ``path`` here -- its folder or a file of it is
    not writable by this user, or lies on a read-only mount -- or ``None`` when nothing
    stands in the way. A writer needs its folder too: SQLite makes the ``-wal`` and ``-shm``
    files beside the ledger."""
    file = Path(os.path.abspath(path))
    if not _writable(file.parent):
        return _folder_state(file.parent)
    for each in (file, Path(f"{file}-wal"), Path(f"{file}-shm")):
        if each.exists() and not os.access(each, os.W_OK):
            return f"{each} is not writable by this user ({_who_may(each)})"
    return None


def _writable(folder: Path) -> bool:
    """Whether this user can make files in ``folder`` (``os.access`` also says no on a
    read-only mount, even to root)."""
    return os.access(folder, os.W_OK | os.X_OK)


def _folder_state(folder: Path) -> str:
    """How a message says why nothing can be made in ``folder``."""
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return f"the folder {folder} is on a read-only file system"
    except OSError:
        pass
    return f"the folder {folder} is read-only for this user ({_who_may(folder)})"


def _who_may(path: Path) -> str:
    """``mode 0555, owner uid 1000``: what a person needs to see why access was refused."""
    try:
        info = path.stat()
    except OSError as error:
        return error.strerror or type(error).__name__
    return f"mode {stat.S_IMODE(info.st_mode):04o}, owner uid {info.st_uid}"


# -- what SQLite's errors say ------------------------------------------------------------------

_UNAVAILABLE = (
    "locked",
    "busy",
    "disk i/o",
    "full",
    "unable to open",
    "readonly",
    "read-only",
    "no such table",  # the file was replaced or emptied under us
)
_CORRUPT = ("malformed", "not a database", "corrupt", "could not decode")


def sqlite_error(error: sqlite3.Error, message: str) -> StoreError:
    """The ``StoreError`` subclass a SQLite error is: the file is damaged or a value cannot be
    decoded (``StoreCorrupt``), it may work later (``StoreUnavailable``), or neither.
    ``message`` is what the error says (it names the store); a duplicate row is the
    caller's to recognise first (docs/design.md §9)."""
    text = str(error).lower()
    if any(marker in text for marker in _CORRUPT):
        return StoreCorrupt(message)
    if isinstance(error, sqlite3.OperationalError) or any(
        marker in text for marker in _UNAVAILABLE
    ):
        return StoreUnavailable(message)
    if isinstance(error, sqlite3.DataError):
        return StoreCorrupt(message)
    return StoreError(message)


def is_damage(error: BaseException) -> bool:
    """Whether SQLite says the file itself is damaged (SQLITE_CORRUPT: a malformed page),
    rather than a value in it or a file that is no database at all."""
    name = getattr(error, "sqlite_errorname", "")
    if name:
        return bool(name.startswith("SQLITE_CORRUPT"))
    return isinstance(error, sqlite3.DatabaseError) and "malformed" in str(error).lower()


def damaged_file(path: str | os.PathLike[str], detail: str, *, refused: str = "") -> StoreCorrupt:
    """``StoreCorrupt`` for a ledger file SQLite found damaged: what it found, what was
    ``refused`` because of it, and the way forward -- keep a copy, see what can still be read,
    copy that into a new file."""
    file = Path(os.path.abspath(path))
    return StoreCorrupt(
        f"the ledger file {file} is damaged ({detail}){refused}. Keep a copy of it before "
        f"anything else; procledger verify lists what can still be read; sqlite3 {file} "
        f".recover | sqlite3 NEW.db copies what is readable into a new file (then procledger "
        f"--url sqlite:///NEW.db rebuild)",
        file=str(file),
    )


# -- a writer's check of the file ----------------------------------------------------------------

CHECKED_BYTES = 16 << 20
"""A writer's open checks the whole file (``PRAGMA quick_check``) up to this size: about 13 ms
on an idle core (measured 8.6 ms for 3,000 processes, 11 MB); beyond it, only once an error
has marked the file damaged (docs/design.md §7.3, "Damaged files")."""
MARK_SUFFIX = "-damaged"


def mark_of(path: str | os.PathLike[str]) -> Path:
    """The file beside a ledger that says SQLite once found it damaged: ``ledger.db-damaged``."""
    return Path(f"{os.path.abspath(path)}{MARK_SUFFIX}")


def leave_mark(path: str | os.PathLike[str], detail: str) -> None:
    """Remember, beside the ledger, that SQLite found it damaged, so that the next writer's
    open checks it whatever its size. Best effort: a folder that cannot be written keeps
    none (a writer cannot open there anyway)."""
    mark = mark_of(path)
    try:
        descriptor = os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError:
        return
    with os.fdopen(descriptor, "w") as file:
        file.write(f"SQLite found {os.path.abspath(path)} damaged: {detail}\n")


def refuse_if_damaged(path: str | os.PathLike[str]) -> None:
    """A writer's check of the ledger file at ``path`` (which exists): ``PRAGMA quick_check``
    when the database is at most ``CHECKED_BYTES``, or marked damaged (``leave_mark``), which
    is then kept or removed by what the check finds.

    Raises:
        StoreCorrupt: the check found damage (``file`` names the ledger; the mark is left).
        sqlite3.Error: SQLite could not run the check for another reason (the caller says
            which store).
    """
    file = Path(os.path.abspath(path))
    marked = mark_of(file).exists()
    connection = sqlite3.connect(f"file:{quote(str(file))}?mode=rw", uri=True)
    try:
        problems = _problems(connection, always=marked)
    except sqlite3.DatabaseError as error:
        if not is_damage(error):
            raise
        problems = [_first_line(error)]
    finally:
        connection.close()
    if problems:
        detail = _summary(problems)
        leave_mark(file, detail)
        raise damaged_file(file, detail, refused="; a writer does not open it")
    if marked:
        mark_of(file).unlink(missing_ok=True)  # repaired, or replaced by a sound copy


def _problems(connection: sqlite3.Connection, *, always: bool) -> list[str]:
    """What ``PRAGMA quick_check`` finds (none: ``[]``), or ``[]`` unchecked when the database
    is larger than ``CHECKED_BYTES`` and not ``always``."""
    if not always:
        (pages,) = connection.execute("PRAGMA page_count").fetchone()
        (page_size,) = connection.execute("PRAGMA page_size").fetchone()
        if pages * page_size > CHECKED_BYTES:
            return []
    found = [
        str(line)
        for (text,) in connection.execute("PRAGMA quick_check")
        for line in str(text).splitlines()
    ]
    return [] if found == ["ok"] else found


def _summary(problems: list[str]) -> str:
    """SQLite's report, shortened for one line: its first problem, and how many there are."""
    lines = [line for line in problems if not line.startswith("***")]
    first = lines[0] if lines else problems[0]
    more = f", and {len(lines) - 1} more" if len(lines) > 1 else ""
    return f"SQLite's integrity check: {first}{more}"
