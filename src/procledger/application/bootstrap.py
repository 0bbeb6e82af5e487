"""The composition root: a URL becomes a store, and the store a registry."""

from __future__ import annotations

from procledger.adapters.sql.location import default_url, ensure_default_folder, parse_store_url
from procledger.adapters.sql.opening import open_store
from procledger.application.registry import Clock, ProcessRegistry


def open_registry(url: str | None = None, *, clock: Clock | None = None) -> ProcessRegistry:
    """Open (creating it if needed) the ledger at ``url`` — ``$PROCLEDGER_URL`` or the
    per-user default when omitted.

    Raises:
        StoreURLError: the URL is malformed or names nothing that can be opened.
        StoreUnavailable: the server or file cannot be reached now.
        StoreError: anything else that stops the ledger from opening (the URL is named,
            its password masked).
    """
    location = parse_store_url(url or default_url())
    if not url:
        ensure_default_folder(location)
    return ProcessRegistry(open_store(location), clock=clock)
