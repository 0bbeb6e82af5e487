"""Projection queries of the registry (change feed, lists, handles, sessions, prune, rebuild)."""

from __future__ import annotations


class ProjectionQueries:
    """Mixed into ``ProcessRegistry``."""
