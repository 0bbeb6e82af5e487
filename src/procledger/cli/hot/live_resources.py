"""`ps --resources`: each running child's latest sample, asked of this host's agent over its
socket (docs/design.md §18.10). The agent samples; the ledger holds only each run's last
sample, once it ended. With no agent answering, the columns say ``-``.
"""

from __future__ import annotations

from typing import Any, Final

from procledger.domain.wording import size_text

__all__ = ["RESOURCE_HEADER", "live_samples", "resource_cells"]

RESOURCE_HEADER: Final = ("CPU", "RSS", "FILES", "THREADS")
_NONE: Final = ("-", "-", "-", "-")


def live_samples(url: str | None, process_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The agent's latest sample of each of ``process_ids`` it has one of; ``{}`` when no
    agent answers (or the ledger cannot have one: in memory)."""
    if not process_ids:
        return {}
    from procledger.agent.launch import ledger_key, resource_samples
    from procledger.domain.errors import ProcledgerError

    try:
        key = ledger_key(url)
    except ProcledgerError:
        return {}
    return resource_samples(key, process_ids)


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
