"""Where a ledger lives (issue 13 and 14, docs/design.md §7.1): SQLAlchemy's SQLite URLs, a
ledger file created ``0600`` in a folder created ``0700``, a warning for one others can read,
``create=False`` that never creates anything, and PostgreSQL's ``retry_s``."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from procledger import StoreError, StoreUnavailable, StoreURLError, open_registry
from procledger.adapters.sql.location import DEFAULT_RETRY_S, parse_store_url

from .conformance import registration


def test_three_slashes_are_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    registry = open_registry("sqlite:///ledger.db")
    try:
        registry.register(registration("r"))
    finally:
        registry.close()
    assert (tmp_path / "ledger.db").exists()
    assert not Path("/ledger.db").exists()


def test_four_slashes_are_absolute(tmp_path: Path) -> None:
    assert parse_store_url(f"sqlite:///{tmp_path}/l.db").sqlite_path == f"{tmp_path}/l.db"
    assert parse_store_url("sqlite:///rel/l.db").sqlite_path == "rel/l.db"
    assert parse_store_url("sqlite:rel/l.db").sqlite_path == "rel/l.db"


@pytest.mark.parametrize("url", ["sqlite://host/l.db", "sqlite:///", "sqlite:///dir/"])
def test_sqlite_urls_that_name_no_file_are_refused(url: str) -> None:
    with pytest.raises(StoreURLError) as caught:
        open_registry(url)
    assert url in str(caught.value)


def test_a_ledger_procledger_creates_is_0600(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    registry = open_registry(f"sqlite:///{path}")
    try:
        registry.register(registration("p"))
        for name in ("ledger.db", "ledger.db-wal", "ledger.db-shm"):
            if (tmp_path / name).exists():
                assert (tmp_path / name).stat().st_mode & 0o777 == 0o600, name
    finally:
        registry.close()


def test_the_default_ledger_and_its_folders_are_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PROCLEDGER_URL", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    os.umask(old := os.umask(0))  # read the umask back, then restore it
    try:
        open_registry().close()
    finally:
        os.umask(old)
    ledger = tmp_path / "data" / "procledger" / "ledger.db"
    assert ledger.stat().st_mode & 0o777 == 0o600
    assert ledger.parent.stat().st_mode & 0o777 == 0o700
    assert ledger.parent.parent.stat().st_mode & 0o777 == 0o700


def test_an_explicit_url_and_the_variable_never_create_a_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path}/missing/ledger.db"
    monkeypatch.setenv("PROCLEDGER_URL", url)
    for given in (url, None):
        with pytest.raises(StoreURLError, match="does not exist"):
            open_registry(given)
    assert not (tmp_path / "missing").exists()


def test_create_false_never_creates_a_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PROCLEDGER_URL", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    with pytest.raises(StoreURLError, match=r"ledger\.db") as caught:
        open_registry(create=False)
    assert str(tmp_path / "data" / "procledger" / "ledger.db") in str(caught.value)
    assert not (tmp_path / "data").exists()
    path = tmp_path / "typo.db"
    with pytest.raises(StoreURLError, match=r"typo\.db"):
        open_registry(f"sqlite:///{path}", create=False)
    assert not path.exists()
    open_registry(f"sqlite:///{path}").close()  # created now; then create=False opens it
    open_registry(f"sqlite:///{path}", create=False).close()


def test_a_ledger_others_can_read_is_warned_about_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "shared.db"
    open_registry(f"sqlite:///{path}").close()
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="procledger.store"):
        open_registry(f"sqlite:///{path}").close()
        open_registry(f"sqlite:///{path}").close()
    warnings = [r for r in caplog.records if "readable by other users" in r.getMessage()]
    assert len(warnings) == 1
    assert str(path) in warnings[0].getMessage()


def test_another_local_user_cannot_read_the_ledger(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("switching to an unprivileged user needs root")
    tmp_path.chmod(0o755)  # the folder is open: only the file's own mode protects it
    path = tmp_path / "ledger.db"
    registry = open_registry(f"sqlite:///{path}")
    try:
        registry.register(registration("secret"))
    finally:
        registry.close()
    result = subprocess.run(
        ["runuser", "-u", "nobody", "--", "cat", str(path)],
        capture_output=True,
        check=False,
        timeout=30,
    )
    assert result.returncode != 0
    assert b"Permission denied" in result.stderr


@pytest.mark.parametrize(
    ("query", "expected"),
    [("", DEFAULT_RETRY_S), ("?retry_s=5", 5.0), ("?schema=s&retry_s=0.5", 0.5)],
)
def test_retry_s_is_parsed_and_kept_out_of_the_connection(query: str, expected: float) -> None:
    location = parse_store_url(f"postgresql://u:pw@h/db{query}")
    assert location.retry_s == expected
    assert "retry_s" not in str(location.pg)


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "soon", "1e9"])
def test_a_bad_retry_s_is_a_url_error_masking_the_password(value: str) -> None:
    with pytest.raises(StoreURLError, match="retry_s") as caught:
        parse_store_url(f"postgresql://u:secret@h/db?retry_s={value}")
    assert "secret" not in str(caught.value)


@pytest.mark.postgres
def test_create_false_never_creates_a_postgres_schema(postgres_schema_url: str) -> None:
    with pytest.raises(StoreURLError, match="no ledger"):
        open_registry(postgres_schema_url, create=False)
    open_registry(postgres_schema_url).close()
    open_registry(postgres_schema_url, create=False).close()


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("sqlite:///l.db?mode=ro", "?mode=ro"),
        ("postgresql://u@localhost/db?sslmode=require", "'sslmode'"),
        ("postgresql://u@localhost/db?schema=s&connect_timeout=5", "'connect_timeout'"),
    ],
)
def test_a_parameter_procledger_would_not_honour_is_refused(url: str, named: str) -> None:
    """Dropping it silently would mislead (``?mode=ro`` would still write, ``sslmode`` would
    not encrypt); the URL is refused before anything is opened or created."""
    with pytest.raises(StoreURLError, match="parameter") as caught:
        parse_store_url(url)
    assert named in str(caught.value)


def test_a_folder_or_a_file_that_is_not_a_ledger_is_named_and_not_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``sqlite:////tmp`` names a folder (a URL error, not an outage to retry); a file that is
    not a SQLite database gets no advice to chmod it, only the error that it is no ledger."""
    with pytest.raises(StoreURLError, match="is a folder, not a ledger file"):
        open_registry(f"sqlite:///{tmp_path}")
    other = tmp_path / "notes.txt"
    other.write_text("not a database, by a long way\n")
    other.chmod(0o644)
    with (
        caplog.at_level(logging.WARNING, logger="procledger.store"),
        pytest.raises(StoreError, match="not a database"),
    ):
        open_registry(f"sqlite:///{other}")
    assert not [r for r in caplog.records if "readable by other users" in r.getMessage()]
    assert other.read_text() == "not a database, by a long way\n"


def test_an_unreachable_server_is_said_once_while_the_open_waits(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening rides through a restarting server for ``retry_s``; a person waiting on a
    mistyped port hears why once the wait is noticeable, once, and gets the error at the end.
    A short wait says nothing more than its one error."""
    postgres = pytest.importorskip("procledger.adapters.sql.postgres")
    monkeypatch.setattr(postgres, "SAY_WAITING_AFTER_S", 0.2)
    url = "postgresql://nobody@127.0.0.1:1/db?retry_s=0.8"
    with (
        caplog.at_level(logging.WARNING, logger="procledger.store"),
        pytest.raises(StoreUnavailable),
    ):
        open_registry(url)
    said = [r.getMessage() for r in caplog.records if "still retrying" in r.getMessage()]
    assert len(said) == 1, said
    assert "port 1" in said[0]
    caplog.clear()
    with pytest.raises(StoreUnavailable):
        open_registry(url.replace("retry_s=0.8", "retry_s=0.1"))
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]


@pytest.mark.postgres
def test_opening_rides_through_a_server_restarting_meanwhile(
    postgres_schema_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restart between connecting and creating the tables ("terminating connection due to
    administrator command") failed the open at once, unlike every other call (§7.3); it is
    tried again within ``retry_s`` now, and the half-opened store is closed."""
    from procledger.adapters.sql import opening

    calls: list[object] = []
    real = opening.migrate

    def flaky(store: object, create_events_table: object) -> None:
        calls.append(store)
        if len(calls) == 1:
            raise StoreUnavailable("terminating connection due to administrator command")
        real(store, create_events_table)  # type: ignore[arg-type]

    monkeypatch.setattr(opening, "migrate", flaky)
    registry = open_registry(postgres_schema_url)
    try:
        registry.register(registration("after-a-restart"))
    finally:
        registry.close()
    assert len(calls) == 2
