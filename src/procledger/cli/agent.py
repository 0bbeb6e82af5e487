"""`procledger agent start|stop|status|run|unit`: the host agent that supervises every background
process of a ledger on this host (docs/design.md §18).

`run --background` starts it on demand; these commands are for people and service managers.
`agent run` is the anchor and the agent in the foreground (a container's entry point, or a
systemd unit: `agent unit` prints one); the agent alone, as the anchor starts it, is
``python -m procledger.agent``.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer

from procledger.cli._app import JsonOption, cli_state
from procledger.cli.lines import write_json

agent_app = typer.Typer(
    name="agent",
    help="The host agent: one crash-safe supervisor for this ledger's background processes.",
    short_help="Start, stop or inspect the host agent.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)


MetricsOption = Annotated[
    str | None,
    typer.Option(
        "--metrics",
        metavar="ADDR",
        help="Serve Prometheus metrics at http://ADDR/metrics (HOST:PORT, or PORT for "
        "127.0.0.1); an agent already running keeps what it was started with.",
    ),
]


def _ask_for_metrics(where: str | None) -> None:
    """Pass ``--metrics`` to the agent the anchor starts, through the environment both
    inherit (checked here first, so a bad address is a usage error, not a line in a log)."""
    if where is None:
        return
    from procledger.agent.host import METRICS_ENV
    from procledger.application.metrics import metrics_address
    from procledger.cli._app import option_errors

    with option_errors():
        metrics_address(where)
    os.environ[METRICS_ENV] = where


def _places(ctx: typer.Context, *, create: bool = True) -> Any:
    from procledger.agent.launch import ledger_key
    from procledger.agent.places import AgentPlaces

    return AgentPlaces.of(ledger_key(cli_state(ctx).url), create=create)


@agent_app.command()
def start(ctx: typer.Context, metrics: MetricsOption = None, as_json: JsonOption = False) -> None:
    """Start the agent (and its anchor) in the background, unless it runs already."""
    from procledger.agent.launch import ask, ensure_agent

    _ask_for_metrics(metrics)
    places, started = ensure_agent(cli_state(ctx).url, _places(ctx))
    status = ask(places, {"op": "status"})
    if as_json:
        write_json({**status, "started": started})
        return
    verb = "started" if started else "already running"
    sys.stdout.write(f"agent {verb}: pid {status['pid']}, socket {places.socket}\n")


@agent_app.command()
def stop(
    ctx: typer.Context,
    stop_children: Annotated[
        bool,
        typer.Option(
            "--stop-children",
            help="Stop every process it supervises (recorded runner_shutdown) before it exits; "
            "by default they keep running and the next agent adopts them.",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Stop the agent (and its anchor), leaving its processes running unless --stop-children."""
    from procledger.agent.launch import ask, ping

    places = _places(ctx, create=False)
    if ping(places) is None:
        _said({"stopped": False, "running": False}, "no agent is running", as_json)
        return
    answer = ask(places, {"op": "shutdown", "stop_children": stop_children}, timeout=10.0)
    gone = _await_gone(places, answer["pid"])
    left = "its processes stopped" if stop_children else "its processes left running"
    said = f"agent stopped ({left})" if gone else "agent asked to stop; it is still stopping"
    _said({"stopped": gone, "pid": answer["pid"], "stop_children": stop_children}, said, as_json)


def _await_gone(places: Any, pid: int, timeout: float = 60.0) -> bool:
    """Whether the agent's socket went quiet within ``timeout`` (its processes' grace)."""
    import time

    from procledger.agent.launch import ping

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = ping(places, timeout=1.0)
        if answer is None or answer.get("pid") != pid:
            return True
        time.sleep(0.02)  # another process's exit: nothing here can wait on it
    return False


@agent_app.command()
def run(ctx: typer.Context, metrics: MetricsOption = None) -> None:
    """Run the anchor and the agent in the foreground (a container's entry point, a systemd
    unit); SIGTERM stops them and leaves the processes running."""
    from procledger.agent.launch import anchor_argv

    _ask_for_metrics(metrics)
    places = _places(ctx)
    if cli_state(ctx).url is not None:
        os.environ["PROCLEDGER_URL"] = cli_state(ctx).url or ""
    argv = anchor_argv(places)
    places.anchor_pidfile.write_text(f"{os.getpid()}\n")  # exec keeps the pid
    os.execv(argv[0], argv)


@agent_app.command()
def unit(ctx: typer.Context) -> None:
    """Print a systemd user unit for the agent (save it as
    ~/.config/systemd/user/procledger-agent.service, then `systemctl --user enable --now
    procledger-agent`)."""
    from procledger.agent.launch import unit_text

    sys.stdout.write(unit_text(cli_state(ctx).url, _places(ctx)))


def _said(document: dict[str, Any], line: str, as_json: bool) -> None:
    if as_json:
        write_json(document)
    else:
        sys.stdout.write(f"{line}\n")


__all__ = ["agent_app"]
