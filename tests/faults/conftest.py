"""Fixtures of the PostgreSQL restart tests: the test cluster, and a schema that outlives a
restart.

A test here restarts the shared cluster, which disturbs any other test using it at that moment;
``restart_url`` therefore waits for the server to accept connections again before it drops the
schema, whatever the test did, so that no later test meets a server that is down.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import pytest

from _cluster import Cluster, find_cluster
from _shared import wait_until


@pytest.fixture
def cluster(postgres_url: str) -> Cluster:
    """The cluster behind ``postgres_url`` (skips unless this test may restart it)."""
    return find_cluster(postgres_url)


@pytest.fixture
def restart_url(
    postgres_schemas: Callable[[], AbstractContextManager[str]], cluster: Cluster
) -> Iterator[str]:
    """A fresh schema on ``cluster``, dropped once the server accepts connections again."""
    with postgres_schemas() as url:
        try:
            yield url
        finally:
            wait_until(cluster.accepting_at, 120, "the server before dropping the schema")
