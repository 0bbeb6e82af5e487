"""`ps --resources`: each running child's latest sample, asked of this host's agent over its
socket (docs/design.md §18.10). The agent samples; the ledger holds only each run's last
sample, once it ended. With no agent answering, the columns say ``-``.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["RESOURCE_HEADER", "live_samples", "resource_cells"]

RESOURCE_HEADER: Final = ("CPU", "RSS", "FILES", "THREADS")
ASK_TIMEOUT_S: Final = 2.0
"""The agent answers from memory in a millisecond; a busy machine may take longer."""
_NONE: Final = ("-", "-", "-", "-")


def live_samples(url: str | None, process_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The agent's latest sample of each of ``process_ids`` it has one of; ``{}`` when no
    agent answers (or the ledger cannot have one: in memory)."""
    if not process_ids:
        return {}
    from procledger.agent.launch import ask, ledger_key
    from procledger.agent.places import AgentPlaces
    from procledger.domain.errors import ProcledgerError

    try:
        places = AgentPlaces.of(ledger_key(url), create=False)
        order = {"op": "resources", "process_ids": process_ids}
        answer = ask(places, order, timeout=ASK_TIMEOUT_S)
    except (ProcledgerError, OSError):
        return {}
    samples = answer.get("samples") if isinstance(answer, dict) else None
    return samples if isinstance(samples, dict) else {}


def resource_cells(sample: dict[str, Any] | None) -> tuple[str, str, str, str]:
    """CPU seconds, RSS, open files and threads for a row; ``-`` each without a sample."""
    if not sample:
        return _NONE
    return (
        f"{sample['cpu_s']:.1f}s",
        size_text(int(sample["rss_bytes"])),
        str(sample["open_files"]),
        str(sample["threads"]),
    )


def size_text(size: int) -> str:
    """Bytes as people read them: ``812K``, ``201.3M``, ``1.2G``."""
    if size < 1024**2:
        return f"{size // 1024}K"
    if size < 1024**3:
        return f"{size / 1024**2:.1f}M"
    return f"{size / 1024**3:.1f}G"
