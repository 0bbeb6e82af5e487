"""A SQLite ledger as a file: the checks before opening it (a folder, a missing file, a file
other users can read) and creating it with private modes. Standard library only, so the CLI's
fast path (a read-only ``sqlite3`` connection, docs/design.md §8.1) refuses and warns in the
very words the backend does.
"""

from __future__ import annotations

import os
from pathlib import Path

from procledger.adapters.sql.location import StoreLocation
from procledger.domain.errors import StoreError, StoreURLError

__all__ = ["FOLDER_MODE", "LEDGER_MODE", "SQLITE_HEADER", "check_ledger_file"]

SQLITE_HEADER = b"SQLite format 3\x00"
"""How every SQLite database file begins (an empty file is a ledger not written yet)."""
LEDGER_MODE = 0o600
"""A ledger file procledger creates: its owner only (env values, argv and outputs are private)."""
FOLDER_MODE = 0o700
"""A folder procledger creates for a ledger."""
_warned: set[str] = set()


def check_ledger_file(location: StoreLocation, path: Path, *, create: bool) -> None:
    """Refuse a folder; create a missing file only when ``create`` -- otherwise a missing file
    is a ``StoreURLError`` naming the path; warn (once) of one other users can read."""
    if path.is_dir():
        raise StoreURLError(f"store URL {location.masked!r}: {path} is a folder, not a ledger file")
    if not path.exists():
        if not create:
            raise StoreURLError(
                f"store URL {location.masked!r}: no ledger at {path.absolute()} "
                "(nothing was created)"
            )
        _create_ledger_file(location, path)
    else:
        _warn_if_readable_by_others(path)


def _create_ledger_file(location: StoreLocation, path: Path) -> None:
    """An empty file SQLite will turn into a database; its WAL and shared-memory files take
    the same mode, since SQLite copies the database file's permissions to them."""
    if location.default:
        _make_private_folders(path.parent)
    elif not path.parent.is_dir():
        raise StoreURLError(f"store URL {location.masked!r}: folder {path.parent} does not exist")
    try:
        descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, LEDGER_MODE)
    except FileExistsError:  # another process created it at the same moment
        return
    except OSError as error:
        raise StoreError(
            f"store URL {location.masked!r}: cannot create {path}: {error.strerror}"
        ) from None
    os.close(descriptor)


def _make_private_folders(folder: Path) -> None:
    """Create ``folder`` and any missing parents, each ``0700`` (the umask cannot widen it)."""
    missing: list[Path] = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for created in reversed(missing):
        try:
            created.mkdir(mode=FOLDER_MODE)
        except FileExistsError:
            continue


def _warn_if_readable_by_others(path: Path) -> None:
    """Log once per file that a ledger other local users can read (it holds argv, env refs
    and, for rerunnable processes, environments)."""
    try:
        mode = path.stat().st_mode
        with path.open("rb") as file:
            header = file.read(len(SQLITE_HEADER))
    except OSError:
        return
    if header not in (b"", SQLITE_HEADER):  # not a ledger: opening it will say so
        return
    key = str(path.absolute())
    if mode & 0o044 and key not in _warned:
        _warned.add(key)
        import logging  # noqa: PLC0415 -- only to warn: the fast path never loads it otherwise

        logging.getLogger("procledger.store").warning(
            "the ledger %s is readable by other users (mode %o); chmod 600 it", key, mode & 0o777
        )
