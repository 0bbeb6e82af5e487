"""Store outages for the outbox tests, made for real and always undone.

- ``sqlite``: the ledger lives on a small tmpfs the test mounts (Linux, as root); the outage
  fills it to the last byte, so every write fails with "database or disk is full"; the end of
  the outage deletes the filler.
- ``postgres``: the test cluster is stopped with ``pg_ctl`` and started again -- in a
  ``finally``, so a failing test never leaves it down.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from _cluster import Cluster, find_cluster
from _shared import fill_up, small_tmpfs


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
            fill_up(self._filler)
        else:
            assert self._cluster is not None
            self._options = self._cluster.stop()

    def end(self) -> None:
        if self._filler is not None:
            self._filler.unlink(missing_ok=True)
        elif self._cluster is not None and self._options:
            self._cluster.start(self._options)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def outage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Outage]:
    if request.param == "sqlite":
        yield from _sqlite_outage(tmp_path)
    else:
        yield from _postgres_outage(request)


def _sqlite_outage(tmp_path: Path) -> Iterator[Outage]:
    with small_tmpfs(tmp_path / "small-disk", "4m") as mnt:
        yield Outage(f"sqlite:///{mnt}/ledger.db", "sqlite", _filler=mnt / "filler")


def _postgres_outage(request: pytest.FixtureRequest) -> Iterator[Outage]:
    # A short ride-through window, so that the outcome outlives it and waits in the outbox.
    url = str(request.getfixturevalue("postgres_schema_url")) + "&retry_s=1"
    outage = Outage(url, "postgres", _cluster=find_cluster(url))
    try:
        yield outage
    finally:
        outage.end()  # never leave the shared cluster down
