"""A readiness's probes as the ``ready`` fact and ``show`` name them (``port:8080``), from its
JSON document: shared by the model (``Readiness.probes``) and the CLI's fast path, which reads
documents (docs/design.md §8.1, §15.2).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["probe_names"]


def probe_names(readiness: Mapping[str, Any]) -> list[str]:
    """A readiness's probes as the ``ready`` fact names them, e.g. ``port:8080``."""
    named = [] if readiness.get("port") is None else [f"port:{readiness['port']}"]
    named += [] if readiness.get("output") is None else [f"output:{readiness['output']}"]
    named += [] if readiness.get("file") is None else [f"file:{readiness['file']}"]
    return named + (["notify"] if readiness.get("notify") else [])
