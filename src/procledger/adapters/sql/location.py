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
    retry_s: float = 0.0
    """How long a call rides through a lost server (PostgreSQL's ``?retry_s=N``, default 30 s;
    0 on SQLite, whose failures are not outages a retry would outlast)."""
    default: bool = False
    """Whether this is the per-user default ledger (its folder is created on demand)."""


DEFAULT_RETRY_S = 30.0
"""The default window a PostgreSQL call keeps retrying a lost connection (docs/design.md §7.1)."""
_MAX_RETRY_S = 86_400.0
_POSTGRES_PARAMETERS = frozenset({"schema", "retry_s"})


def default_ledger_path() -> Path:
    """The per-user ledger: ``$XDG_DATA_HOME/procledger/ledger.db`` (made absolute)."""
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home).absolute() / "procledger" / "ledger.db"


def sqlite_url(path: Path | str) -> str:
    """The URL of a SQLite file, in SQLAlchemy's form: ``sqlite:////abs.db`` for an absolute
    path, ``sqlite:///rel.db`` for one relative to the working directory."""
    return f"sqlite:///{path}"


def locate(url: str | None) -> StoreLocation:
    """The location ``url`` names; with none, ``$PROCLEDGER_URL`` or the per-user default
    (only the latter is marked ``default``: an explicit URL and the variable mean the same)."""
    if url:
        return parse_store_url(url)
    configured = os.environ.get("PROCLEDGER_URL")
    if configured:
        return parse_store_url(configured)
    location = parse_store_url(sqlite_url(default_ledger_path()))
    return StoreLocation("sqlite", location.masked, sqlite_path=location.sqlite_path, default=True)


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
    """SQLAlchemy's convention: ``sqlite:///rel.db`` is relative to the working directory,
    ``sqlite:////abs.db`` absolute (``sqlite:rel.db`` is also accepted, as relative)."""
    rest = url[len("sqlite:") :]
    if rest.startswith("///"):
        path = rest[3:]
    elif rest.startswith("//"):
        raise StoreURLError(
            f"store URL {masked!r}: a SQLite URL has no host; use sqlite:///relative.db "
            "or sqlite:////absolute/path.db"
        )
    else:
        path = rest
    path, _, query = path.partition("?")
    if query:
        raise StoreURLError(
            f"store URL {masked!r}: a SQLite URL takes no parameters (?{query}); "
            "procledger opens the file read-write itself"
        )
    if not path or path.endswith("/"):
        raise StoreURLError(f"store URL {masked!r}: no database path")
    return StoreLocation("sqlite", masked, sqlite_path=unquote(path))


def _parse_postgres(url: str, masked: str) -> StoreLocation:
    parts = urlsplit(url)
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(query.keys() - _POSTGRES_PARAMETERS)
    if unknown:  # silently ignoring one (sslmode=require, say) would mislead
        raise StoreURLError(
            f"store URL {masked!r}: unknown parameter {unknown[0]!r} "
            "(a PostgreSQL URL takes schema and retry_s)"
        )
    schema = query.get("schema", ["public"])[0]
    retry_s = _retry_window(query.get("retry_s", [str(DEFAULT_RETRY_S)])[0], masked)
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
    return StoreLocation("postgresql", masked, pg=pg, schema=schema, retry_s=retry_s)


def _retry_window(text: str, masked: str) -> float:
    """``retry_s`` as a finite number of seconds, 0 to a day (0: fail at once)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= _MAX_RETRY_S:  # also refuses NaN
        raise StoreURLError(
            f"store URL {masked!r}: retry_s must be a number of seconds from 0 to "
            f"{_MAX_RETRY_S:.0f}, not {text!r}"
        )
    return value


def store_key(location: StoreLocation) -> str | None:
    """What names a ledger in outbox entries; ``None`` for an in-memory store, which dies with
    its process and so has nothing to deliver later."""
    if location.in_memory:
        return None
    if location.sqlite_path:
        return f"sqlite:{os.path.realpath(location.sqlite_path)}"
    pg = location.pg  # the database and schema, not how one connects (user, retry window)
    return f"postgresql://{pg['host']}:{pg['port']}/{pg['dbname']}?schema={location.schema}"
