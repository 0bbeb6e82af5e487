"""A named start's preparations before its registration (docs/design.md §19): a name another
live service holds is answered at once, and a port to lease is reserved, put in ``$PORT`` and
probed for readiness.

The registering transaction decides both for good (``application.service_claims``); looking
first only spares a start whose name is taken a reserved port, and a reserved port is what lets
the registration -- its environment and probes -- name the port before it is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
from collections.abc import Mapping, Sequence
from typing import Any

from procledger.adapters.proc_facts import host_id
from procledger.application.registry import ProcessRegistry
from procledger.application.service_claims import DEFAULT_PORT_RANGE, is_bindable
from procledger.domain.errors import NameTaken, OptionError, PortTaken
from procledger.domain.service import Readiness
from procledger.supervisor.minting import new_process_id
from procledger.supervisor.requests import StartRequest, opened

__all__ = ["PORT_RANGE_VARIABLE", "named_opened", "port_range", "prepared_names"]

PORT_RANGE_VARIABLE = "PROCLEDGER_PORT_RANGE"
"""``LOW-HIGH``: where ``port="auto"`` looks when the start names no range."""


def prepared_names(request: StartRequest, registry: ProcessRegistry) -> StartRequest:
    """``request`` ready to register: its name checked, its port reserved (an id minted to
    hold it), ``$PORT`` set and a port probe added (none replaced).

    Raises:
        NameTaken: a live service holds the name (nothing written).
        PortTaken: the port is leased to a live process or bound by another program here, or
            (``auto``) every port of the range is.
        OptionError: ``$PROCLEDGER_PORT_RANGE`` is not ``LOW-HIGH``.
    """
    if request.name is not None and request.attempt_of is None:
        named = registry.services.named(request.name)
        if named is not None and named.live and named.newest is not None:
            raise NameTaken(request.name, named.newest.id)
    if request.port is None or request.attempt_of is not None:
        return request
    process_id = request.process_id or new_process_id(registry.now_ms())
    if request.port == "auto":
        chosen = request.port_range or port_range()
        port = registry.services.reserve_port(host_id(), process_id, chosen)
    else:
        port = request.port
        _check_free(registry, port, process_id)
    env = dict(os.environ if request.env is None else request.env)
    env["PORT"] = str(port)
    ready = request.ready or Readiness(port=port)
    if ready.port is None:
        ready = ready.model_copy(update={"port": port})
    return dataclasses.replace(request, process_id=process_id, port=port, env=env, ready=ready)


def named_opened(
    signature: inspect.Signature,
    registry: ProcessRegistry,
    sources: contextlib.ExitStack,
    argv: Sequence[str],
    options: Mapping[str, Any],
) -> tuple[StartRequest, int | None]:
    """A start of ``start_all`` checked as ``start`` checks it (``requests.opened``), its name
    and port prepared as ``start`` prepares them."""
    request, source = opened(signature, sources, argv, options)
    return prepared_names(request, registry), source


def _check_free(registry: ProcessRegistry, port: int, process_id: str) -> None:
    ours = (process_id, f"{process_id}.")  # a retried start of this service, or its attempt
    for lease in registry.services.ports(host_id(), port):
        if lease.live and not (lease.process_id == ours[0] or lease.process_id.startswith(ours[1])):
            message = f"port {port} is leased to process {lease.process_id!r}"
            raise PortTaken(message, port, lease.process_id)
    if not is_bindable(port, listening_only=True):
        raise PortTaken(
            f"port {port} is in use on this host by a program procledger did not start", port
        )


def port_range() -> tuple[int, int]:
    """``$PROCLEDGER_PORT_RANGE`` (``LOW-HIGH``), else ``DEFAULT_PORT_RANGE``."""
    text = os.environ.get(PORT_RANGE_VARIABLE, "").strip()
    if not text:
        return DEFAULT_PORT_RANGE
    low, sep, high = text.partition("-")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit():
        raise OptionError(PORT_RANGE_VARIABLE, f"{text!r} is not a range such as 20000-29999")
    bounds = int(low), int(high)
    if not (1 <= bounds[0] <= bounds[1] <= 65535):
        raise OptionError(PORT_RANGE_VARIABLE, f"{text!r} is not a range of ports (1-65535)")
    return bounds
