"""`up`, `down` and `restart`: the services of a service file, run by this host's agent
(docs/design.md §19).

``up`` converges: each service (dependencies first, each dependency *ready* before its
dependents start) is left alone when it runs as defined -- its newest attempt carries the
digest of the definition -- started when it does not run, and stopped and started again when
its definition changed. What ``up`` asked is recorded in the ledger before the start (the
``services`` table: definition, digest, environment), so the agent that starts after a reboot
brings it back; ``down`` records the opposite and stops the services, dependents first.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from procledger.cli._app import JsonOption, cli_state, open_ledger, option_errors
from procledger.cli.config import FileOption
from procledger.cli.lines import write_json, write_line
from procledger.domain.durations import parse_duration
from procledger.domain.errors import NameTaken, ProcledgerError, SpawnError

if TYPE_CHECKING:
    from procledger import ProcessRegistry
    from procledger.agent.places import AgentPlaces
    from procledger.domain.service_file import ServiceDefinition, ServiceFile

__all__ = ["down", "restart", "up"]

START_WAIT_S = 120.0
"""How long a start waits for the agent's answer (as `run --background`)."""

Names = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="NAME", help="Services of the file (default: every one).", show_default=False
    ),
]
TimeoutOption = Annotated[
    str,
    typer.Option(
        "--timeout",
        metavar="DURATION",
        help="How long a dependency may take to be ready (0.2s, 60s, 5m, 1h).",
    ),
]


class ServiceFailed(ProcledgerError):
    """A service that `up` could not bring to run (it ended before it was ready, or its
    program could not be started); the services after it are not started."""


@dataclass(frozen=True)
class Converged:
    """What `up` or `restart` did to one service."""

    name: str
    action: str  # running, started, restarted, stopped, down
    process_id: str | None

    def line(self) -> str:
        said = {
            "running": "running as defined",
            "started": "started",
            "restarted": "restarted (its definition changed)",
            "replaced": "restarted",
            "stopped": "stopped",
            "down": "not running",
        }[self.action]
        return f"{self.name}: {said}" + (f" ({self.process_id})" if self.process_id else "")


def up(
    ctx: typer.Context,
    names: Names = None,
    file: FileOption = None,
    timeout: TimeoutOption = "60s",
    as_json: JsonOption = False,
) -> None:
    """Start the file's services that do not run, restart those whose definition changed,
    leave the rest; each dependency ready before its dependents start. The agent brings them
    back after a reboot until `down`."""
    with option_errors():
        ready_s = parse_duration(timeout, option="--timeout")
    services = _load(file)
    with option_errors():
        order = services.order(names or None)
    awaited = {dep for name in order for dep in services.services[name].depends_on}
    done: list[Converged] = []
    with open_ledger(cli_state(ctx).url) as registry:
        places = _agent(cli_state(ctx).url)
        for name in order:
            converged = _converge(registry, places, services, name, replace=False)
            done.append(converged)
            _say(converged, as_json)
            if name in awaited and converged.process_id is not None:
                _until_ready(registry, name, converged.process_id, ready_s)
    if as_json:
        write_json([vars(each) for each in done])


def down(
    ctx: typer.Context,
    names: Names = None,
    file: FileOption = None,
    as_json: JsonOption = False,
) -> None:
    """Stop the services (dependents first) and record that they are not to run: the agent
    no longer brings them back. Without a file, every service `up` left desired here."""
    from procledger.cli.naming import stop_named

    done: list[Converged] = []
    planned = _file_down_order(file, names)
    with open_ledger(cli_state(ctx).url, create=False) as registry:
        for name, grace_s in planned or _desired_down_order(registry, names):
            registry.services.want_down(name)
            ended = stop_named(registry, name, grace_s)
            converged = Converged(name, "down" if ended is None else "stopped", ended)
            done.append(converged)
            _say(converged, as_json)
    if as_json:
        write_json([vars(each) for each in done])


def restart(
    ctx: typer.Context,
    names: Annotated[
        list[str],
        typer.Argument(metavar="NAME", help="The services to restart.", show_default=False),
    ],
    file: FileOption = None,
    as_json: JsonOption = False,
) -> None:
    """Stop the services and start them again from the file (each waits for the one before to
    end; their dependencies are left running)."""
    services = _load(file)
    with option_errors():
        order = services.order(names)  # a name not in the file: a usage error, nothing done
    done: list[Converged] = []
    with open_ledger(cli_state(ctx).url) as registry:
        places = _agent(cli_state(ctx).url)
        for name in order:
            if name in names:
                converged = _converge(registry, places, services, name, replace=True)
                done.append(converged)
                _say(converged, as_json)
    if as_json:
        write_json([vars(each) for each in done])


def _load(file: str | None) -> ServiceFile:
    from procledger.adapters.service_files import load_service_file

    return load_service_file(file)


def _agent(url: str | None) -> AgentPlaces:
    from procledger.agent.launch import ensure_agent

    return ensure_agent(url)[0]


def _say(converged: Converged, as_json: bool) -> None:
    if not as_json:
        write_line(converged.line())


def _converge(
    registry: ProcessRegistry,
    places: AgentPlaces,
    services: ServiceFile,
    name: str,
    *,
    replace: bool,
) -> Converged:
    """One service brought to run as defined (``replace``: stopped and started again)."""
    from procledger.cli.naming import stop_named

    definition = services.services[name]
    digest = definition.digest()
    env = {**os.environ, **definition.env}
    order = _order(definition, digest, env, services.port_range)
    _want_up(registry, definition, order, env)
    named = registry.services.named(name)
    action = "started"
    if named is not None and named.live and named.newest is not None:
        if named.newest.digest == digest and not replace:
            return Converged(name, "running", named.newest.id)
        stop_named(registry, name, definition.grace_s)
        action = "replaced" if replace and named.newest.digest == digest else "restarted"
    return Converged(name, action, _start(places, order))


def _order(
    definition: ServiceDefinition,
    digest: str,
    env: dict[str, str],
    port_range: tuple[int, int] | None,
) -> dict[str, Any]:
    """The agent's ``start`` order for ``definition`` (``agent.orders.StartOrder``)."""
    return {
        "op": "start",
        "argv": list(definition.command),
        "cwd": definition.cwd,
        "env": env,
        "stdin": "null",
        "capture": True,
        "output_limit": definition.output_limit,
        "ready": None if definition.ready is None else definition.ready.model_dump(mode="json"),
        "restart": None
        if definition.restart is None
        else definition.restart.model_dump(mode="json"),
        "stop_signal": definition.stop_signal,
        "grace_s": definition.grace_s,
        "name": definition.name,
        "digest": digest,
        "port": definition.port,
        "port_range": port_range,
    }


def _want_up(
    registry: ProcessRegistry,
    definition: ServiceDefinition,
    order: dict[str, Any],
    env: dict[str, str],
) -> None:
    """Record the desired state before the start: a `up` killed after its start still leaves
    the service to be brought back."""
    from procledger.adapters.proc_facts import host_id

    desired = {key: value for key, value in order.items() if key not in ("op", "env")}
    desired["depends_on"] = list(definition.depends_on)
    registry.services.want_up(
        definition.name,
        host_id=host_id(),
        digest=str(order["digest"]),
        definition=desired,
        env_ref=registry.store_env(env),
    )


def _start(places: AgentPlaces, order: dict[str, Any]) -> str:
    """Start through the agent; the id of the new process, or of the one that holds the name
    (another `up` or `run --name` got there first)."""
    import time

    from procledger.agent.launch import ask
    from procledger.cli.hot.starting import started_id
    from procledger.supervisor.minting import new_process_id

    process_id = new_process_id(int(time.time() * 1000))
    answer = ask(places, {**order, "process_id": process_id}, timeout=START_WAIT_S)
    try:
        return started_id(answer)
    except NameTaken as taken:
        return taken.process_id
    except SpawnError as error:
        raise ServiceFailed(f"service {order['name']}: {error.strerror}") from None


def _until_ready(registry: ProcessRegistry, name: str, process_id: str, timeout_s: float) -> None:
    """A dependency ready before its dependents start, or `up` stops here saying why."""
    from procledger.cli._format import ending

    try:
        record = registry.await_ready(process_id, timeout=timeout_s)
    except TimeoutError:
        raise ServiceFailed(
            f"service {name} was not ready within {timeout_s:g} s: its dependents were not "
            f"started (procledger logs {name} says why)"
        ) from None
    if record.ready_at_ms is None and record.is_terminal:
        raise ServiceFailed(
            f"service {name} ended before it was ready ({ending(record)}): its dependents "
            f"were not started (procledger logs {name} says why)"
        )


def _file_down_order(file: str | None, names: list[str] | None) -> list[tuple[str, float]]:
    """The services to stop, dependents first, each with its stop grace, from the file when
    there is one (or one is named; checked before the ledger is opened); else none."""
    from procledger.adapters.service_files import DEFAULT_FILE_NAME

    if file is None and not os.path.exists(DEFAULT_FILE_NAME):
        return []
    services = _load(file)
    with option_errors():
        order = services.dependents_first(names or None)
    return [(name, services.services[name].grace_s) for name in order]


def _desired_down_order(
    registry: ProcessRegistry, names: list[str] | None
) -> list[tuple[str, float]]:
    """Without a file: every service desired up on this ledger (or those named), in the
    reverse of the order its agent would bring them back in."""
    from procledger.agent.bring_back import dependency_order

    every = {d.name: d for d in registry.services.desired()}
    for name in names or ():
        if name not in every:
            raise typer.BadParameter(f"no service {name!r} was brought up here", param_hint="NAME")
    wanted = {n: d for n, d in every.items() if d.desired == "up" and (not names or n in names)}
    desired = [wanted[name] for name in dependency_order(wanted.values())]
    return [(d.name, float(d.definition.get("grace_s", 10.0))) for d in reversed(desired)]
