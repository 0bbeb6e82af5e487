"""Stop and Abandon from the web view: the CLI's rules (``supervisor/control.py``), carried out
by this server as ``procledger-web@<host id>`` (docs/design.md §8, §16)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from procledger.agent.launch import tell_of_stop
from procledger.application.outbox import store_key
from procledger.supervisor.control import (
    NobodyToStop,
    StillOwned,
    abandon_process,
    host_owner,
    stop_target,
)
from procledger.supervisor.modes import StopMode

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry
    from procledger.domain.records import ProcessRecord

_STOP_WORDS = {"asked": "asked", "here": "stopped", "orphan": "stopped", "ended": "ended"}
"""``stop_target``'s answers in the page's words (a kept orphan's child stopped here too)."""

DEFAULT_GRACE_S = 10.0
"""As ``procledger stop --grace``: how long an orphaned tree stopped here gets before SIGKILL."""
MAX_GRACE_S = 86_400.0


class BadAction(ValueError):
    """An action's parameter that names no mode, or a grace that is not 0 to 86400 seconds."""


class Actions:
    """The actions of one server; each opens nothing, runs in a worker thread and returns the
    record as it is after the action."""

    def __init__(self, registry: ProcessRegistry) -> None:
        self.registry = registry
        self.owner = host_owner("procledger-web")

    def stop(
        self, text: str, mode: str, grace: str | float = DEFAULT_GRACE_S
    ) -> tuple[ProcessRecord, str]:
        """Stop the process ``text`` names -- a whole service for any attempt's id, a kept
        orphan's child (``supervisor.control.stop_target``); the record and what happened:
        ``asked`` (its owner carries it out), ``stopped`` (here) or ``ended`` (already).
        ``NobodyToStop`` when nobody can."""
        chosen = _mode(mode)
        grace_s = _grace(grace)
        found = self.registry.resolve_process_id(text)
        done = stop_target(self.registry, found, chosen, grace_s, self.owner)
        if done.how == "asked":  # this host's agent, if it holds the process, acts on it now
            tell_of_stop(store_key(self.registry.location), done.record.id)
        return done.record, _STOP_WORDS[done.how]

    def abandon(self, text: str, reason: str | None) -> tuple[ProcessRecord, str]:
        """Abandon the process ``text`` names: ``abandoned`` or ``ended`` (already);
        ``StillOwned`` while someone holds it."""
        record = self.registry.get(self.registry.resolve_process_id(text))
        if record.state.is_terminal:
            return record, "ended"
        return abandon_process(self.registry, record, self.owner, reason), "abandoned"

    def stop_said(self, text: str, mode: str) -> str:
        """As ``stop``, for the page: a word for what happened, refusals included."""
        try:
            return self.stop(text, mode)[1]
        except NobodyToStop:
            return "nobody"

    def abandon_said(self, text: str, reason: str | None) -> str:
        try:
            return self.abandon(text, reason)[1]
        except StillOwned:
            return "owned"


def _mode(text: str) -> StopMode:
    try:
        return StopMode(text)
    except ValueError:
        raise BadAction(f"{text!r} is not a stop mode (interrupt, terminate, kill)") from None


def _grace(value: str | float) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0.0 <= seconds <= MAX_GRACE_S):
        raise BadAction(f"grace {value!r} is not a number of seconds from 0 to 86400")
    return seconds
