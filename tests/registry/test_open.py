"""Opening a store (docs/design.md §7): URLs that cannot be opened raise ``StoreError`` naming the
URL with any password masked; the default URL and ``$PROCLEDGER_URL``."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from procledger import StoreError, StoreUnavailable, open_registry

from .conformance import registration


def _closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _open_fails(url: str) -> str:
    with pytest.raises(StoreError) as caught:
        open_registry(url)
    return str(caught.value)


def test_unknown_scheme_names_the_url_with_password_masked() -> None:
    message = _open_fails("ftp://alice:hunter2@example.org/ledger")
    assert "hunter2" not in message
    assert "ftp://alice:***@example.org/ledger" in message
    assert "scheme" in message


def test_sqlite_folder_that_does_not_exist(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/missing/ledger.db"
    message = _open_fails(url)
    assert url in message
    assert "does not exist" in message
    assert not (tmp_path / "missing").exists()


def test_sqlite_path_that_is_a_folder(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}"
    assert url in _open_fails(url)


def test_sqlite_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "not-a-db.db"
    path.write_bytes(b"this is not SQLite " * 100)
    url = f"sqlite:///{path}"
    assert url in _open_fails(url)


def test_sqlite_url_without_a_path() -> None:
    assert "'sqlite:'" in _open_fails("sqlite:")


def test_unreachable_postgres_masks_the_password() -> None:
    url = f"postgresql://bob:hunter2@127.0.0.1:{_closed_port()}/ledger?schema=s1&retry_s=0"
    message = _open_fails(url)
    assert "hunter2" not in message
    assert url.replace("hunter2", "***") in message


def test_an_unreachable_server_is_retried_for_retry_s_then_unavailable() -> None:
    url = f"postgresql://bob:hunter2@127.0.0.1:{_closed_port()}/ledger?retry_s=1"
    began = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        open_registry(url)
    assert 0.9 <= time.monotonic() - began < 10
    assert "hunter2" not in str(caught.value)
    assert url.replace("hunter2", "***") in str(caught.value)


@pytest.mark.parametrize("port", ["notaport", "99999"])
def test_postgres_bad_port_is_a_store_error(port: str) -> None:
    message = _open_fails(f"postgresql://bob:hunter2@127.0.0.1:{port}/ledger")
    assert "hunter2" not in message
    assert "port" in message


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://bob:hunter2@127.0.0.1:5432/ledger?schema=bad-name",
        "postgresql://bob:hunter2@/ledger",
        "postgresql://bob:hunter2@127.0.0.1:5432/",
    ],
)
def test_postgres_malformed_urls(url: str) -> None:
    message = _open_fails(url)
    assert "hunter2" not in message
    assert url.replace("hunter2", "***") in message


@pytest.mark.postgres
def test_postgres_database_that_does_not_exist(postgres_url: str) -> None:
    base = postgres_url.rsplit("/", 1)[0]
    url = f"{base}/no_such_database_{socket.gethostname().replace('-', '_')[:8]}"
    message = _open_fails(url)
    assert "no_such_database" in message


def test_default_url_follows_procledger_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROCLEDGER_URL", f"sqlite:///{tmp_path}/from-env.db")
    registry = open_registry()
    try:
        registry.register(registration("p"))
    finally:
        registry.close()
    assert (tmp_path / "from-env.db").exists()


def test_default_url_is_under_xdg_data_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PROCLEDGER_URL", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    registry = open_registry()
    try:
        registry.register(registration("p"))
    finally:
        registry.close()
    assert (tmp_path / "data" / "procledger" / "ledger.db").exists()
