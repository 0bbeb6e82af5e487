"""Where a ledger's agent keeps its things on this host (docs/design.md §18): its socket folder
(``control_client.socket_dir``: ``$XDG_RUNTIME_DIR``, a tmpfs gone at logout) and, under the
state directory, what must survive a reboot of the agent but not of the host -- the anchor's exit
journal and the agent's log.

One agent per user, host and ledger: every path is named by the ledger's store key, so two
ledgers on one host get two agents that never meet, and every client of one ledger finds the
same agent.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from procledger.adapters.state_dir import state_dir, subdirectory
from procledger.agent.control_client import SOCKET_NAME, socket_dir

__all__ = ["AgentPlaces"]


@dataclass(frozen=True, slots=True)
class AgentPlaces:
    """The agent's paths for one ledger (``key``: its store key, e.g. ``sqlite:/path``)."""

    key: str
    socket_folder: str
    home: Path

    @classmethod
    def of(cls, key: str, *, create: bool = True) -> AgentPlaces:
        """The places of ``key``'s agent (folders created ``0700`` with ``create``).

        Raises:
            AgentSocketError: the socket folder is not private, or its path too long.
        """
        folder = socket_dir(key, create=create)
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        if not create:
            return cls(key, folder, state_dir() / "agent" / digest)
        home = subdirectory("agent") / digest
        home.mkdir(mode=0o700, exist_ok=True)
        return cls(key, folder, home)

    @property
    def socket(self) -> str:
        return os.path.join(self.socket_folder, SOCKET_NAME)

    @property
    def journal(self) -> Path:
        """The anchor's exit journal (``exit_journal``)."""
        return self.home / "exits"

    @property
    def log(self) -> Path:
        """The anchor's and the agent's stderr: one line per event worth keeping."""
        return self.home / "agent.log"

    @property
    def anchor_pidfile(self) -> Path:
        """The pid of the anchor the last start made (for `agent status` and for tests that
        must clean up by exact pid)."""
        return self.home / "anchor.pid"

    @property
    def start_lock(self) -> Path:
        """Held by whoever starts the agent, so two racing starts make one agent."""
        return self.home / "start.lock"
