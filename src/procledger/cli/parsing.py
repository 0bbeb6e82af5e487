"""The hot commands' parser, built by ``argparse`` from their table (``cli.table``): one parser
for the fast path and the full CLI alike (docs/design.md §8.1).
"""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from procledger.cli.lines import PROG
from procledger.cli.table import Argument, CommandSpec, Option
from procledger.cli.values import UsageError

__all__ = ["UsageError", "parse"]


class _Parser(argparse.ArgumentParser):
    """A mistake is a ``UsageError`` for the caller to report as the one line, not argparse's
    usage block and exit."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message.removeprefix("argument ").replace("argument ", ""))


class _Help(argparse.HelpFormatter):
    """``Usage: procledger ps [OPTIONS]...`` as the full CLI's help begins; the description's
    paragraphs each wrapped to the terminal."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = text.split("\n\n")
        return "\n\n".join(super(_Help, self)._fill_text(p, width, indent) for p in paragraphs)

    def add_usage(self, usage: Any, actions: Any, groups: Any, prefix: Any = None) -> None:
        super().add_usage(usage, actions, groups, "Usage: " if prefix is None else prefix)


class _Value(argparse.Action):
    """Turns an option's text into its value with the table's ``value`` function (``UsageError``
    names the flag), keeping every value of a repeatable option."""

    def __init__(self, *args: Any, spec: Option, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spec = spec

    def __call__(
        self, parser: Any, namespace: Any, values: Any, option_string: str | None = None
    ) -> None:
        flag = self.spec.flags[0]
        if self.spec.choices and values not in self.spec.choices:
            allowed = ", ".join(repr(choice) for choice in self.spec.choices)
            raise UsageError(f"{values!r} is not one of {allowed}", flag)
        value = self.spec.value(values, flag)
        if self.spec.repeat:
            value = [*(getattr(namespace, self.dest, None) or []), value]
        setattr(namespace, self.dest, value)


def _parser(spec: CommandSpec) -> _Parser:
    parser = _Parser(
        prog=f"{PROG} {spec.name}",
        usage=spec.usage,
        description=spec.help,
        allow_abbrev=False,
        formatter_class=_Help,
    )
    for param in spec.parameters():
        if isinstance(param, Argument) and param.rest:
            parser.add_argument(
                param.dest, metavar=param.metavar, nargs=argparse.REMAINDER, help=param.help
            )
        elif isinstance(param, Argument):
            nargs = "?" if param.optional else None
            parser.add_argument(param.dest, metavar=param.metavar, nargs=nargs, help=param.help)
        elif param.metavar is None:
            parser.add_argument(*param.flags, dest=param.dest, action="store_true", help=param.help)
        else:
            parser.add_argument(
                *param.flags,
                dest=param.dest,
                metavar=param.metavar,
                help=param.help,
                default=param.default,
                action=_Value,
                spec=param,
            )
    return parser


def parse(spec: CommandSpec, words: list[str]) -> argparse.Namespace:
    """``words`` (what follows the command's name) as the command's options; ``--help`` prints
    the command's help and exits 0. Raises ``UsageError``."""
    try:
        options = _parser(spec).parse_args(words)
    except UsageError as error:
        if str(error).startswith("unrecognized arguments: --url"):
            # The app's option, where the command's go: say where it belongs.
            where = f"{PROG} --url URL {spec.name} ..."
            raise UsageError(f"--url goes before the command: {where}") from None
        raise _with_suggestion(spec, error) from None
    for param in spec.parameters():
        if isinstance(param, Argument) and param.rest:
            rest = getattr(options, param.dest)
            setattr(options, param.dest, rest[1:] if rest[:1] == ["--"] else rest)
            if not getattr(options, param.dest):
                raise UsageError(f"the command is missing: {spec.usage or spec.name}")
    return options


def _with_suggestion(spec: CommandSpec, error: UsageError) -> UsageError:
    """An unknown option, with the command's options it may have meant (as click says)."""
    message = str(error)
    if not message.startswith("unrecognized arguments: -"):
        return error
    import difflib

    typed = message.removeprefix("unrecognized arguments: ").split()[0].split("=")[0]
    flags = [f for param in spec.parameters() if isinstance(param, Option) for f in param.flags]
    close = difflib.get_close_matches(typed, flags, n=3)
    if not close:
        return error
    return UsageError(f"no such option: {typed} (possible options: {', '.join(close)})")
