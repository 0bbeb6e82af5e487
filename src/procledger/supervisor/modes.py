"""How ``Supervisor.stop`` ends a process (docs/design.md §6.2), in a module of its own: the CLI
names the modes in its options without importing the supervisor."""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from procledger.domain.vocabulary import TerminalReason

__all__ = ["StopMode"]


class StopMode(StrEnum):
    """How ``Supervisor.stop`` ends a process (docs/design.md §6.2)."""

    interrupt = "interrupt"
    """SIGINT to the tree, wait the grace, never escalate."""
    terminate = "terminate"
    """SIGTERM to the tree, wait the grace, then SIGKILL once."""
    kill = "kill"
    """SIGKILL to the tree at once."""

    @property
    def reason(self) -> TerminalReason:
        """The ``stop_requested`` reason this mode records."""
        return _MODE_REASONS[self]


_MODE_REASONS: Final = {
    StopMode.interrupt: TerminalReason.interrupted,
    StopMode.terminate: TerminalReason.terminated,
    StopMode.kill: TerminalReason.killed,
}
