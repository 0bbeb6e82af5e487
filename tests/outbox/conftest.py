"""Store outages for the outbox tests, made for real and always undone.

- ``sqlite``: the ledger lives on a small tmpfs the test mounts (Linux, as root); the outage
  fills it to the last byte, so every write fails with "database or disk is full"; the end of
  the outage deletes the filler.
- ``postgres``: the test cluster is stopped with ``pg_ctl`` and started again -- in a
  ``finally``, so a failing test never leaves it down.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from _shared import wait_until


@pytest.fixture(autouse=True)
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``$XDG_STATE_HOME`` in the test's folder: the outbox of the test (and of the processes
    it starts) is never the user's."""
    home = tmp_path / "state-home"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home


@dataclass
class Outage:
    """A store that can be made unavailable and available again."""

    url: str
    kind: str
    _start: list[str]
    _stop: list[str]
    _filler: Path | None = None

    def begin(self) -> None:
        if self.kind == "sqlite":
            assert self._filler is not None
            _fill(self._filler)
        else:
            subprocess.run(self._stop, check=True, capture_output=True, timeout=60)

    def end(self) -> None:
        if self.kind == "sqlite":
            assert self._filler is not None
            self._filler.unlink(missing_ok=True)
        else:
            _pg_start(self._start)


def _fill(path: Path) -> None:
    """Write ``path`` (unbuffered) until the file system is full (ENOSPC)."""
    with open(path, "wb", buffering=0) as file:
        for size in (65536, 4096, 512, 1):
            with contextlib.suppress(OSError):
                while True:
                    file.write(b"\0" * size)


def _pg_start(start: list[str]) -> None:
    subprocess.run(start, check=False, capture_output=True, timeout=120)


def _runuser(*argv: str) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def outage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Outage]:
    if request.param == "sqlite":
        yield from _sqlite_outage(tmp_path)
    else:
        yield from _postgres_outage(request)


def _sqlite_outage(tmp_path: Path) -> Iterator[Outage]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a full tmpfs needs root (mount)")
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield Outage(f"sqlite:///{mnt}/ledger.db", "sqlite", [], [], mnt / "filler")
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True)


def _postgres_outage(request: pytest.FixtureRequest) -> Iterator[Outage]:
    # A short ride-through window, so that the outcome outlives it and waits in the outbox.
    url = str(request.getfixturevalue("postgres_schema_url")) + "&retry_s=1"

    base = os.environ["PROCLEDGER_TEST_POSTGRES_URL"]
    data = _data_directory(base)
    binaries = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if not binaries:
        pytest.skip("pg_ctl not found under /usr/lib/postgresql")
    pg_ctl = str(binaries[-1])
    # The server's own options (its port, say) are in postmaster.opts: a plain start loses them.
    opts = shlex.split(Path(data, "postmaster.opts").read_text())[1:]
    port = str(urlsplit(base).port or 5432)
    options = shlex.join([*_without_port(opts), "-p", port])
    log = f"{data}/restart.log"
    start = _runuser(pg_ctl, "-D", data, "-w", "-t", "60", "-o", options, "-l", log, "start")
    stop = _runuser(pg_ctl, "-D", data, "-w", "-t", "60", "-m", "fast", "stop")
    try:
        yield Outage(url, "postgres", start, stop)
    finally:
        _pg_start(start)  # never leave the shared cluster down
        wait_until(lambda: _answers(base), 60, "the PostgreSQL server to answer again")


def _without_port(options: list[str]) -> list[str]:
    kept: list[str] = []
    skip = False
    for option in options:
        if skip:
            skip = False
        elif option == "-p":
            skip = True
        else:
            kept.append(option)
    return kept


def _data_directory(url: str) -> str:
    """The cluster's data directory: asked of the server, or (a role that may not ask) found
    as the running postmaster whose ``postmaster.pid`` names the URL's port."""
    import psutil
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=10) as conn:
            row = conn.execute("SHOW data_directory").fetchone()
        if row is not None:
            return str(row[0])
    except psycopg.Error:
        pass
    port = str(urlsplit(url).port or 5432)
    for process in psutil.process_iter(["name"]):
        if process.info["name"] != "postgres":
            continue
        with contextlib.suppress(OSError, IndexError, psutil.Error):
            data = process.cwd()  # a postmaster runs in its data directory
            if Path(data, "postmaster.pid").read_text().splitlines()[3].strip() == port:
                return data
    pytest.skip(f"cannot find the data directory of the server on port {port}")


def _answers(url: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True
