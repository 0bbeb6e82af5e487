"""Who the CLI is in the ledger: this host's CLI owner and its notification session.

`run` supervises one command as ``procledger-cli@<host id>`` (a fresh incarnation per run) and
publishes its completion into the CLI's own notification session, so `restore` can republish
it -- same command id -- for a run whose `procledger` died. Both derive everything from the
owner id, so any later `procledger` on the host finds the same session.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from procledger import LeaseOwner, Notifier, ProcessRegistry


def cli_owner() -> LeaseOwner:
    """This host's CLI owner, as a fresh incarnation (so `restore` can tell runs apart)."""
    from procledger.supervisor.control import host_owner

    return host_owner("procledger-cli")


def cli_notifier(registry: ProcessRegistry, owner: LeaseOwner) -> tuple[Notifier, uuid.UUID]:
    """The CLI owner's notification session and its one loop (both derived from the owner id)."""
    from procledger import Notifier
    from procledger.supervisor.control import owner_session

    session_id, loop_id = owner_session(owner.owner_id)
    notifier = Notifier(registry, session_id)
    notifier.add_loop(loop_id)
    return notifier, loop_id
