"""What an agent starts after its takeover: the services ``up`` left desired on this host whose
run ended while no agent could restart them (docs/design.md §19).

PM2's ``resurrect`` starts what a dump file lists; here the ledger says both what was wanted
(the ``services`` table) and what became of it (the records), so a service that still runs --
held by the takeover, adopted by pid, start time and marker -- is left alone, one that a person
stopped or that gave up stays down, and one that ended unseen (a reboot: ``lost_on_restore``),
was shut down with its agent, or failed in a way its policy restarts comes back -- as the next
attempt of the same service, so its name, its port and its attempts' history go on. Two agents
bringing one service back cannot both start it: the next attempt's id is the same for both,
and its registration is the claim.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from procledger.application.registry import ProcessRegistry
from procledger.application.service_book import DesiredService
from procledger.domain.attempts import attempt_id, restart_may_follow
from procledger.domain.errors import NotFound
from procledger.domain.records import ProcessRecord
from procledger.domain.service_file import start_order
from procledger.domain.vocabulary import ProcessState, TerminalReason

__all__ = ["Return", "dependency_order", "returns", "should_come_back"]

log = logging.getLogger("procledger.agent")

_UNSEEN = (ProcessState.lost_on_restore, ProcessState.abandoned)


@dataclass(frozen=True)
class Return:
    """A service to start again: its start order (``agent.orders.StartOrder``'s fields) and
    the names of the services it waits on."""

    name: str
    order: dict[str, Any]
    depends_on: tuple[str, ...]


def should_come_back(newest: ProcessRecord | None, first: ProcessRecord | None) -> bool:
    """Whether a desired service whose newest attempt is ``newest`` is to be started again by
    an agent that just took over: not while it runs, never after a stop or a crash loop; yes
    when it ended unseen, was shut down with its agent, or ended as its policy restarts."""
    if newest is None:
        return True
    if not newest.is_terminal or newest.gave_up is not None:
        return False
    stops = [*newest.stop_requested, *newest.service_stop_requested]
    if first is not None:
        stops += first.service_stop_requested
    if stops:
        return False
    if newest.state in _UNSEEN or newest.reason is TerminalReason.runner_shutdown:
        return True
    return restart_may_follow(newest, first=first)


def returns(registry: ProcessRegistry, host_id: str, mint: Any) -> list[Return]:
    """The services of ``host_id`` to start again, dependencies first; ``mint()`` gives a new
    process id for a service whose records are gone. Reads only."""
    wanted = {d.name: d for d in registry.services.desired(host_id) if d.desired == "up"}
    found: list[Return] = []
    for name in dependency_order(wanted.values()):
        desired = wanted[name]
        try:
            back = _return_of(registry, desired, mint)
        except Exception as error:  # one service's trouble does not keep the others down
            log.warning("service %s: cannot bring it back: %s", name, error)
            continue
        if back is not None:
            found.append(back)
    return found


def _return_of(registry: ProcessRegistry, desired: DesiredService, mint: Any) -> Return | None:
    named = registry.services.named(desired.name)
    newest = None if named is None else named.newest
    first = None
    if named is not None and newest is not None and newest.attempt is not None:
        first = newest if newest.id == named.first_id else _record(registry, named.first_id)
    if not should_come_back(newest, first):
        return None
    definition = dict(desired.definition)
    depends_on = tuple(definition.pop("depends_on", ()))
    env = registry.load_env(desired.env_ref) if desired.env_ref is not None else {}
    order = {**definition, "op": "start", "env": env, "name": desired.name}
    if named is None or newest is None or newest.attempt is None or newest.restart is None:
        order["process_id"] = mint()
    else:
        _as_next_attempt(order, named.first_id, newest)
    log.info("service %s: bringing it back as process %s", desired.name, order["process_id"])
    return Return(desired.name, order, depends_on)


def _as_next_attempt(order: dict[str, Any], first_id: str, newest: ProcessRecord) -> None:
    """The order as the service's next attempt: same name, same leased port."""
    assert newest.attempt is not None
    order["process_id"] = attempt_id(first_id, newest.attempt + 1)
    order["attempt_of"] = first_id
    if newest.port is not None:
        order["port"] = newest.port
        order["env"] = {**order["env"], "PORT": str(newest.port)}
        ready = dict(order.get("ready") or {})
        if ready.get("port") is None:
            ready["port"] = newest.port
        order["ready"] = ready


def _record(registry: ProcessRegistry, process_id: str) -> ProcessRecord | None:
    try:
        return registry.get(process_id)
    except NotFound:
        return None


def dependency_order(desired: Iterable[DesiredService]) -> list[str]:
    """The names of ``desired`` dependencies first, ties by name (``service_file.start_order``
    over the ``depends_on`` each ``up`` recorded)."""
    graph = {d.name: tuple(d.definition.get("depends_on", ())) for d in desired}
    return start_order({name: graph[name] for name in sorted(graph)})
