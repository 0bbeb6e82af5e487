"""The registry conformance suite on a PostgreSQL schema (one fresh schema per test)."""

from __future__ import annotations

import pytest

from _stores import PostgresCase

from .conformance import RegistryConformance

pytestmark = pytest.mark.postgres


class TestPostgresRegistry(PostgresCase, RegistryConformance):
    pass
