"""The durable notification journal, as registry methods."""

from __future__ import annotations


class JournalMixin:
    """Mixed into ``ProcessRegistry``."""
