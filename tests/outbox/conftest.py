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
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from _cluster import Cluster, find_cluster


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
    _filler: Path | None = None
    _cluster: Cluster | None = None
    _options: str = ""

    def begin(self) -> None:
        if self._filler is not None:
            _fill(self._filler)
        else:
            assert self._cluster is not None
            self._options = self._cluster.stop()

    def end(self) -> None:
        if self._filler is not None:
            self._filler.unlink(missing_ok=True)
        elif self._cluster is not None and self._options:
            self._cluster.start(self._options)


def _fill(path: Path) -> None:
    """Write ``path`` (unbuffered) until the file system is full (ENOSPC)."""
    with open(path, "wb", buffering=0) as file:
        for size in (65536, 4096, 512, 1):
            with contextlib.suppress(OSError):
                while True:
                    file.write(b"\0" * size)


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
        yield Outage(f"sqlite:///{mnt}/ledger.db", "sqlite", _filler=mnt / "filler")
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True)


def _postgres_outage(request: pytest.FixtureRequest) -> Iterator[Outage]:
    # A short ride-through window, so that the outcome outlives it and waits in the outbox.
    url = str(request.getfixturevalue("postgres_schema_url")) + "&retry_s=1"
    outage = Outage(url, "postgres", _cluster=find_cluster(url))
    try:
        yield outage
    finally:
        outage.end()  # never leave the shared cluster down
