"""`serve`: the live web view (docs/design.md §16). Glue only: the options, then
``procledger.web.app.serve``, imported in the command's body so that no other command loads
starlette, uvicorn or jinja2."""

from __future__ import annotations

from typing import Annotated

import typer

from procledger.cli._app import cli_state
from procledger.cli.lines import EXIT_STOPPED


def serve(
    ctx: typer.Context,
    *,
    host: Annotated[
        str,
        typer.Option(
            "--host", metavar="ADDRESS", help="Where to listen; not loopback needs --token."
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, metavar="N", help="0: any free port.")
    ] = 8765,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            metavar="TOKEN",
            envvar="PROCLEDGER_WEB_TOKEN",
            show_envvar=False,
            help="The access token (default: a random one, printed in the URL).",
        ),
    ] = None,
) -> None:
    """Serve a live web view of the ledger.

    Prints a URL with a random access token (as Jupyter does); every page, stream and API
    call needs it. Loopback only unless --host and an explicit --token are given."""
    try:
        from procledger.web.app import LoopbackOnly, serve
    except ImportError as exc:
        missing = f"the web view is not installed ({exc.name}): pip install 'procledger[web]'"
        raise typer.BadParameter(missing) from None
    try:
        serve(cli_state(ctx).url, host, port, token)
    except LoopbackOnly as exc:
        raise typer.BadParameter(str(exc), param_hint="--host") from None
    except KeyboardInterrupt:  # uvicorn shuts down on Ctrl-C, then raises it again
        raise typer.Exit(EXIT_STOPPED) from None
