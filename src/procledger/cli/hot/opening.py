"""Opening the ledger for a hot command (``application.document_reads.open_reads``): on the fast
path a SQLite file read with the standard library, or a PostgreSQL ledger through this host's
agent; else the registry (docs/design.md §8.1).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from procledger.application.document_reads import LedgerReads, open_reads

__all__ = ["reading"]


@contextmanager
def reading(url: str | None, *, fast: bool) -> Iterator[LedgerReads]:
    """The ledger's reads, closed after the block."""
    reads = open_reads(url, fast=fast, agent=_through_agent)
    try:
        yield reads
    finally:
        reads.close()


def _through_agent(store_key: str) -> LedgerReads:
    """A server's ledger, read through this host's agent (imported only for one)."""
    from procledger.cli.hot.agent_reads import agent_reads

    return agent_reads(store_key)
