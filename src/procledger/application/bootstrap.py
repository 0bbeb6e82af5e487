"""The composition root: a URL becomes a store, and the store a registry."""

from __future__ import annotations

from procledger.adapters.sql.location import locate, mask_url
from procledger.adapters.sql.opening import open_store
from procledger.application.registry import Clock, ProcessRegistry

__all__ = ["mask_url", "open_registry"]
"""``mask_url`` (a URL with its password as ``***``) is the façade's, for the layers above
that show a ledger's URL (the web view) and may not reach into ``adapters.sql``."""


def open_registry(
    url: str | None = None,
    *,
    clock: Clock | None = None,
    create: bool = True,
    read_only: bool = False,
) -> ProcessRegistry:
    """Open the ledger at ``url`` — ``$PROCLEDGER_URL`` or the per-user default when omitted
    (an explicit URL and the variable mean exactly the same).

    With ``create`` (the default) a missing SQLite file is created ``0600`` — and, for the
    per-user default only, its folder ``0700`` — and missing tables or a missing PostgreSQL
    schema are created. With ``create=False`` nothing is ever created: read-only commands use
    it, so a mistyped path is an error rather than a new empty ledger.

    Opening creates or migrates the tables to this release's schema version (a ledger of an
    earlier release is migrated here). With ``read_only`` it creates nothing, runs no DDL and
    takes no write lock, and every write through the registry raises ``StoreError``: the read
    commands open so. A ledger with no tables yet still gets them (docs/design.md §7.1).

    Raises:
        StoreURLError: the URL is malformed or names nothing that can be opened (with
            ``create=False`` or ``read_only``: no ledger there, naming the path).
        SchemaTooNew: a newer procledger migrated the ledger (naming it and both versions).
        StoreUnavailable: the server or file cannot be reached now.
        StoreError: anything else that stops the ledger from opening (the URL is named,
            its password masked).
    """
    opened = open_store(locate(url), create=create, read_only=read_only)
    return ProcessRegistry(opened, clock=clock)
