"""`procledger config check|show`: the service file (``procledger.toml``, docs/design.md §19.2)
read and checked without starting or recording anything.

``check`` is for an editor, a commit hook or CI: silence is not an answer, so success is one
line (how many services, in which order they start) and a mistake is exactly the error's one
line, ``PATH:LINE:COL: KEY: what``, with exit 1 -- not prefixed with ``procledger config:`` as
other errors are, so that editors and ``grep`` read the place at the start of the line, as they
do a compiler's. ``show`` prints what ``up`` would run: every default filled in, every path
absolute, every duration in seconds, and each service's digest.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from procledger.cli._app import JsonOption
from procledger.cli.lines import EXIT_FAILURE, write_json, write_line

if TYPE_CHECKING:
    from procledger.domain.service_file import ServiceFile

config_app = typer.Typer(
    name="config",
    help="The service file (procledger.toml): check it, or show what it defines.",
    short_help="Check or show the service file (procledger.toml).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)

FileOption = Annotated[
    str | None,
    typer.Option(
        "--file",
        "-f",
        metavar="PATH",
        help="The service file.  [default: procledger.toml in this directory]",
    ),
]


@config_app.command(short_help="Check the service file; exit 1 at its first mistake.")
def check(file: FileOption = None, as_json: JsonOption = False) -> None:
    """Check the service file: one line with its services in start order, or its first
    mistake as PATH:LINE:COL: KEY: what (exit 1)."""
    loaded = _loaded(file)
    if as_json:
        write_json(_document(loaded))
        return
    count = len(loaded.services)
    services = "service" if count == 1 else "services"
    write_line(f"{loaded.path}: {count} {services}, in order: {', '.join(loaded.order())}")


@config_app.command(short_help="Print the services as up would run them, as JSON.")
def show(file: FileOption = None) -> None:
    """Print the services as up would run them, as JSON: defaults filled in, paths absolute,
    durations in seconds, each with its digest."""
    import orjson

    loaded = _loaded(file)
    sys.stdout.write(orjson.dumps(_document(loaded), option=orjson.OPT_INDENT_2).decode() + "\n")


def _loaded(file: str | None) -> ServiceFile:
    """The file, checked; a ``ServiceFileError`` is its own line on stderr, and exit 1."""
    from procledger.adapters.service_files import load_service_file
    from procledger.domain.errors import ServiceFileError

    try:
        return load_service_file(file)
    except ServiceFileError as error:
        line = str(error).replace("\r", "\\r").replace("\n", "\\n")
        sys.stderr.write(f"{line}\n".encode(errors="backslashreplace").decode())
        sys.stderr.flush()
        raise typer.Exit(EXIT_FAILURE) from None


def _document(loaded: ServiceFile) -> dict[str, Any]:
    """The file as JSON: its services (file order) with their digests, and the start order."""
    services = {
        name: {**service.model_dump(mode="json"), "digest": service.digest()}
        for name, service in loaded.services.items()
    }
    port_range = None if loaded.port_range is None else list(loaded.port_range)
    return {
        "path": loaded.path,
        "order": loaded.order(),
        "port_range": port_range,
        "services": services,
    }


__all__ = ["config_app"]
