"""Fixtures shared by the whole suite: a real PostgreSQL, the hypothesis profiles, a ledger
several processes share and the PID recorder.

PostgreSQL tests take ``postgres_schema_url`` (one fresh schema per test) or
``postgres_schemas`` (a factory, for hypothesis tests and tests that need several ledgers).
Without ``$PROCLEDGER_TEST_POSTGRES_URL`` they skip locally and fail in CI (``CI=true``);
``.ci/pg-dev`` starts a throwaway server and prints the export line.

``shared_url`` runs a test twice: on a SQLite file and on a PostgreSQL schema; ``registry`` is
the ledger at ``registry_url`` (``shared_url`` unless a module names another, e.g. a SQLite file
of its own), opened for the test and closed after it; ``owner`` is a lease owner of the test's
own. ``procs`` records every process a test creates and kills it *by exact pid* at teardown
(see ``_shared.Processes``).
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from psycopg import sql

from _cluster import connect_waiting
from _shared import IN_CI, Processes, kill_agents
from procledger import LeaseOwner, ProcessRegistry, open_registry

# A suite started from a non-interactive shell's background job inherits SIGINT *ignored*
# (POSIX job-control rules), and an ignored signal stays ignored across exec: every child the
# tests start would then shrug off Ctrl-C. A handler (unlike SIG_IGN) is reset to the default
# in children, so install Python's own.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
POSTGRES_URL_VARIABLE = "PROCLEDGER_TEST_POSTGRES_URL"

settings.register_profile("default", deadline=None)
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=100,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if IN_CI else "default"))


def with_schema(url: str, schema: str) -> str:
    """``url`` with its ``schema`` query parameter set to ``schema`` (others kept)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "schema"]
    query.append(("schema", schema))
    return urlunsplit(parts._replace(query=urlencode(query)))


def _conninfo(url: str) -> str:
    """The URL as libpq understands it: without procledger's own ``schema`` parameter."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "schema"]
    return urlunsplit(parts._replace(query=urlencode(query)))


def _drop_schema(url: str, schema: str) -> None:
    with connect_waiting(_conninfo(url), autocommit=True) as conn:
        # A connection left idle in a transaction on the schema must fail the teardown, not
        # hang it.
        conn.execute("SET lock_timeout = '10s'")
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@contextmanager
def _fresh_schema(url: str) -> Iterator[str]:
    schema = f"t_{uuid.uuid4().hex}"
    try:
        yield with_schema(url, schema)
    finally:
        _drop_schema(url, schema)


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The test server's URL (no schema); skips locally and fails in CI when unset."""
    url = os.environ.get(POSTGRES_URL_VARIABLE, "").strip()
    if not url:
        message = f"${POSTGRES_URL_VARIABLE} is not set"
        if IN_CI:
            pytest.fail(f"{message}: CI must run the PostgreSQL tests (.ci/run starts a server)")
        pytest.skip(f"{message} (run .ci/pg-dev to start a throwaway server)")
    try:
        with connect_waiting(_conninfo(url)) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        pytest.fail(f"${POSTGRES_URL_VARIABLE} names a server that does not answer: {exc}")
    return url


@pytest.fixture(scope="session")
def postgres_schemas(postgres_url: str) -> Callable[[], AbstractContextManager[str]]:
    """A factory: ``with postgres_schemas() as url:`` gives a URL with a fresh, unique
    ``?schema=t_<hex>`` (not created: the store creates it) and drops it, CASCADE, on exit.
    Session-scoped, so hypothesis tests can take one schema per example."""
    return lambda: _fresh_schema(postgres_url)


@pytest.fixture
def postgres_schema_url(
    postgres_schemas: Callable[[], AbstractContextManager[str]],
) -> Iterator[str]:
    """A URL with a fresh, unique schema for this test, dropped (CASCADE) afterwards."""
    with postgres_schemas() as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh ledger that several OS processes can open: a SQLite file, then (a second run of
    the test) a PostgreSQL schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/shared.db"
    return str(request.getfixturevalue("postgres_schema_url"))


@pytest.fixture
def registry_url(shared_url: str) -> str:
    """The ledger ``registry`` opens: ``shared_url``. A module whose tests need one store only
    overrides this fixture (and keeps ``registry``)."""
    return shared_url


@pytest.fixture
def registry(registry_url: str) -> Iterator[ProcessRegistry]:
    """The ledger at ``registry_url``, closed after the test (also when it closed it itself:
    closing twice is harmless). A module that wants it filled first overrides ``registry``
    with a fixture that takes this one."""
    opened = open_registry(registry_url)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def owner() -> LeaseOwner:
    """A local-process lease owner of this test's own (this process, a fresh owner id)."""
    return LeaseOwner.local_process(f"test-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    """The processes this test creates, killed by exact pid at teardown."""
    processes = Processes(tmp_path)
    yield processes
    processes.kill_all()


@pytest.fixture
def services(ledger: str, procs: Processes) -> Iterator[Any]:
    """Named services on the test's ``ledger``, run by a Supervisor in this process
    (``_services.Services``), shut down at the end after every child is killed by pid."""
    from _services import Services

    made = Services(ledger, procs)
    try:
        yield made
    finally:
        procs.kill_all()
        made.close()


@pytest.fixture(autouse=True)
def _private_state_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every test (and every child it starts) keeps outbox files, captured output and host
    agents' sockets and journals in folders of its own, never in the user's; every agent a
    test started (``run --background``) is killed at its end, with its whole tree, by the
    exact pids its anchor's pid file names."""
    state = tmp_path_factory.mktemp("state")
    runtime = tmp_path_factory.mktemp("run")
    runtime.chmod(0o700)
    previous = {name: os.environ.get(name) for name in ("XDG_STATE_HOME", "XDG_RUNTIME_DIR")}
    os.environ["XDG_STATE_HOME"], os.environ["XDG_RUNTIME_DIR"] = str(state), str(runtime)
    try:
        yield
    finally:
        kill_agents(state)
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
