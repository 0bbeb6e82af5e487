"""The test PostgreSQL cluster, restarted from a test: where it lives, and ``pg_ctl restart``.

Only root can do it (``pg_ctl`` runs as the cluster's owner, ``postgres``, via ``runuser``);
elsewhere the tests that need it skip. A restart waits until the server accepts connections
again before it returns, so no other test is left facing a server that is down.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from _shared import wait_until

SERVER_BACK_WITHIN_S = 60.0
"""How long to wait for the cluster to accept connections before failing: fault tests on
other workers stop and restart it for a few seconds at a time."""


def connect_waiting(conninfo: str, **options: Any) -> psycopg.Connection[Any]:
    """A connection to the test cluster, waiting out an outage another worker's fault test
    made (``SERVER_BACK_WITHIN_S``)."""
    deadline = time.monotonic() + SERVER_BACK_WITHIN_S
    while True:
        try:
            return psycopg.connect(conninfo, connect_timeout=5, **options)
        except psycopg.OperationalError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)  # the server is down: nothing to wait on but time


@dataclass(frozen=True)
class Cluster:
    data: Path
    bin: Path
    conninfo: str

    def restart(self, mode: str) -> float:
        """``pg_ctl restart -m MODE``; returns the monotonic time at which the server
        accepted a connection again (measured here, by connecting)."""
        self._pg_ctl("restart", "-m", mode)
        return wait_until(self.accepting_at, 120, "the server to accept connections")

    def stop(self) -> str:
        """Stop the server; returns its command-line options, for ``start`` (a plain
        ``pg_ctl start`` would drop them: port, socket folder, ``max_connections``...)."""
        options = self.options()
        self._pg_ctl("stop", "-m", "fast")
        return options

    def start(self, options: str) -> float:
        """Start the server with ``options`` (a no-op if it runs); wait until it accepts."""
        if self.accepting_at() is None:
            self._pg_ctl("start", "-o", options)
        return wait_until(self.accepting_at, 120, "the server to accept connections")

    def options(self) -> str:
        """The running server's options from ``postmaster.opts``, without the data folder."""
        words = shlex.split((self.data / "postmaster.opts").read_text())[1:]
        kept: list[str] = []
        skip = False
        for word in words:
            if skip:
                skip = False
            elif word == "-D":
                skip = True
            else:
                kept.append(word)
        return shlex.join(kept)

    def _pg_ctl(self, *args: str) -> None:
        log = self.data.parent / "server.log"  # where the cluster already logs
        command = ["runuser", "-u", "postgres", "--", str(self.bin / "pg_ctl"), args[0]]
        command += ["-D", str(self.data), *args[1:], "-w", "-t", "120", "-l", str(log)]
        subprocess.run(command, check=True, capture_output=True, timeout=180)

    def accepting_at(self) -> float | None:
        try:
            with psycopg.connect(self.conninfo, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error:
            return None
        return time.monotonic()


def find_cluster(url: str) -> Cluster:
    """The cluster behind ``url`` (skips unless this test can restart it)."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("restarting the test cluster needs root (pg_ctl runs as postgres)")
    parts = urlsplit(url)
    conninfo = url.split("?", 1)[0]
    admin = f"host={parts.hostname} port={parts.port or 5432} user=postgres dbname=postgres"
    with connect_waiting(admin) as conn:
        row = conn.execute("SHOW data_directory").fetchone()
    assert row is not None
    bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if not bins:
        pytest.skip("pg_ctl not found under /usr/lib/postgresql")
    return Cluster(Path(row[0]), bins[-1].parent, conninfo)
