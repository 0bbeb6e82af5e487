"""The full CLI's list filters (``prune``): ages and statuses as usage errors naming the
option. (`ps`, `show` and `feed` are hot commands: ``cli.hot``.)"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from procledger.cli._app import option_errors

if TYPE_CHECKING:
    from procledger import ProcessListFilter


def parse_age(text: str, option: str) -> int:
    """``--since 2h``, ``--older-than 30d``: milliseconds ago, or a usage error naming
    ``option``."""
    from procledger.domain.service import age_ms  # pydantic: only when a filter needs it

    with option_errors():
        return age_ms(text, option=option)


_FILTER_OPTIONS = {"status": "--status", "identity_label": "--label"}


def decode_filter(keys: dict[str, object]) -> ProcessListFilter:
    """The list filter the options name; a value it refuses (``--status bogus``) is a usage
    error naming the option, like a bad ``--state``."""
    from procledger import FilterError, ProcessListFilter

    try:
        return ProcessListFilter.decode(keys)
    except FilterError as error:
        message = str(error).removeprefix(f"filter key {error.key!r}: ")
        raise typer.BadParameter(message, param_hint=_FILTER_OPTIONS.get(error.key)) from None
