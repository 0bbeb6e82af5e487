"""Store URLs: which ledger a URL names, and how messages show it.

Parsing is pure string work and raises ``StoreURLError`` naming the (masked) URL, so a typo is
reported before any driver is loaded or any file is created.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qs, unquote, urlsplit

from procledger.domain.errors import StoreURLError

DialectName = Literal["sqlite", "postgresql"]
_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


@dataclass(frozen=True)
class StoreLocation:
    """A parsed store URL. ``masked`` is what messages show (never the password)."""

    dialect: DialectName
    masked: str
    sqlite_path: str = ""
    in_memory: bool = False
    pg: dict[str, str] = field(default_factory=dict)
    schema: str = "public"


def default_url() -> str:
    """``$PROCLEDGER_URL``, else the per-user SQLite ledger under ``$XDG_DATA_HOME``."""
    configured = os.environ.get("PROCLEDGER_URL")
    if configured:
        return configured
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return f"sqlite:///{data_home}/procledger/ledger.db"


def mask_url(url: str) -> str:
    """The URL with its password replaced by ``***``: safe for messages and logs."""
    return re.sub(r"(//[^:/@]*:)[^@]*@", r"\1***@", url)


def parse_store_url(url: str) -> StoreLocation:
    """A ``StoreLocation``; ``StoreURLError`` names a URL that names no store."""
    masked = mask_url(url)
    if url == "memory://" or url.startswith("memory:"):
        return StoreLocation("sqlite", masked, in_memory=True)
    if url.startswith("sqlite:"):
        return _parse_sqlite(url, masked)
    if url.startswith(("postgresql://", "postgres://")):
        return _parse_postgres(url, masked)
    raise StoreURLError(
        f"store URL {masked!r}: unknown scheme (use memory://, sqlite:///path.db "
        "or postgresql://user:password@host:port/dbname)"
    )


def _parse_sqlite(url: str, masked: str) -> StoreLocation:
    rest = url[len("sqlite:") :]
    path = rest[2:] if rest.startswith("//") else rest
    if not path or path == "/":
        raise StoreURLError(f"store URL {masked!r}: no database path")
    return StoreLocation("sqlite", masked, sqlite_path=unquote(path))


def _parse_postgres(url: str, masked: str) -> StoreLocation:
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    schema = query.get("schema", ["public"])[0]
    if not _SCHEMA_NAME.match(schema):
        raise StoreURLError(f"store URL {masked!r}: schema {schema!r} is not a plain identifier")
    dbname = parts.path.lstrip("/")
    if not dbname or not parts.hostname:
        raise StoreURLError(f"store URL {masked!r}: needs a host and a database name")
    try:
        port = parts.port or 5432
    except ValueError:  # not a number, or out of range
        raise StoreURLError(f"store URL {masked!r}: the port must be a number 1-65535") from None
    pg = {
        "dbname": unquote(dbname),
        "host": parts.hostname,
        "port": str(port),
        "user": unquote(parts.username or os.environ.get("USER", "postgres")),
        "password": unquote(parts.password or ""),
    }
    return StoreLocation("postgresql", masked, pg=pg, schema=schema)


def ensure_default_folder(location: StoreLocation) -> None:
    """Create the folder of the per-user default ledger (only that one: a folder named in an
    explicit URL must exist, so a typo is an error rather than a new empty ledger)."""
    if location.dialect == "sqlite" and not location.in_memory:
        Path(location.sqlite_path).parent.mkdir(parents=True, exist_ok=True)
