"""`run`'s options, each defined once (docs/design.md §8): the flags a person types, how they
parse and what they must agree with, all on one field of ``RunOptions``.

A field of ``RunOptions`` owns its flags (``run``'s signature, and so its ``--help``, is made
from them in field order) and the parser that turns their text into the field's value. The
flags are parsed once, in the foreground; the host agent (``run --background``) receives the
parsed options as its ``start`` order (``cli.hot.starting.start_order``) and parses no flag again. A
refused value is a usage error naming the flag (exit 2), found before anything is recorded;
with several, the first in ``--help`` order is named (the command's words last).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from procledger.cli.lines import is_utf8
from procledger.cli.specs import Argument, Option
from procledger.cli.values import UsageError, grace, usage_errors
from procledger.domain import sizes
from procledger.domain.errors import ProcledgerError

if TYPE_CHECKING:
    from procledger import Readiness, RestartPolicy

StdinSource = Literal["inherit", "null", "pipe"] | Path
"""What the child reads: ``Supervisor.start``'s ``stdin`` (docs/design.md §6.2)."""

Raw = Mapping[str, Any]
"""``run``'s words as the parser read them: each option's text as typed (``vars(namespace)``)."""


def _cli(*flags: Option, parse: Callable[[Raw], Any]) -> dict[str, Any]:
    """A ``RunOptions`` field's metadata: typed on the command line as ``flags`` (one or more
    options of ``run``), valued by ``parse`` from their text."""
    return {"flags": flags, "parse": parse}


def _as_typed(value: str, option: str) -> str:
    """A path only read here (``--stdin``): any bytes will do."""
    return value


def _text(dest: str, flag: str, metavar: str, help: str, default: str | None = None) -> Option:
    """An option whose value is text, parsed with the others by its field."""
    if dest == "stdin":
        return Option((flag,), dest, help, metavar, default, value=_as_typed)
    return Option((flag,), dest, help, metavar, default)


def _switch(dest: str, flag: str, help: str) -> Option:
    return Option((flag,), dest, help)


_HOST_SIGNALS = {name: int(number) for name, number in signal.Signals.__members__.items()}
"""This host's signals by name (aliases such as ``SIGIOT`` too), for the domain's parser."""


def parse_size(text: str) -> int:
    """``--output-limit``: ``512KiB``, ``1MiB``, ``64MiB`` or plain bytes."""
    with usage_errors():
        return sizes.parse_size(text, option="--output-limit")


def parse_signal(value: str) -> signal.Signals:
    """``TERM``, ``SIGTERM`` or ``15``; anything else is a usage error (exit 2)."""
    with usage_errors():
        number = sizes.parse_signal(value, option="--stop-signal", names=_HOST_SIGNALS)
    return signal.Signals(number)


def parse_stdin(value: str | None, background: bool) -> StdinSource:
    """``--stdin``: ``inherit`` (foreground default), ``null`` (background default) or a
    readable file, checked before anything is recorded."""
    if value is None:
        return "null" if background else "inherit"
    if value == "null":
        return "null"
    if value == "pipe":
        if not background:
            message = "--stdin pipe is a background run's (send writes to it)"
            raise UsageError(message, "--stdin")
        return "pipe"
    if value == "inherit":
        if background:
            message = "a background run has no stdin to inherit (use null or a file)"
            raise UsageError(message, "--stdin")
        return "inherit"
    path = Path(value).absolute()
    if not path.is_file() or not os.access(path, os.R_OK):
        message = f"{value!r} is neither inherit, null, pipe nor a readable file"
        raise UsageError(message, "--stdin")
    return path


class UnrecordableInput(ProcledgerError):
    """What `run` was given cannot be kept in the ledger as text (non-UTF-8 bytes)."""


def checked_command(command: list[str]) -> tuple[str, ...]:
    """Refuse, before anything is recorded, what the ledger cannot keep as text: an argument
    or a working directory that is not valid UTF-8 (docs/design.md §8) -- and an empty
    command word, which names no program."""
    if not command[0]:
        raise UsageError("the command is empty; nothing was recorded", "CMD")
    for index, word in enumerate(command):
        if not is_utf8(word):
            shown = os.fsencode(word)
            message = f"argument {index} ({shown!r}) is not valid UTF-8; nothing was recorded"
            raise UsageError(message, "CMD")
    try:
        workdir = os.getcwd()
    except FileNotFoundError:
        message = "the working directory was deleted: cd to one that exists; nothing was recorded"
        raise UnrecordableInput(message) from None
    if not is_utf8(workdir):
        raise UnrecordableInput(
            f"the working directory {os.fsencode(workdir)!r} is not valid UTF-8: "
            "run from another directory; nothing was recorded"
        )
    return tuple(command)


def _readiness(raw: Raw) -> Readiness | None:
    """The ``--ready-*`` probes (docs/design.md §15.1); matching output needs it captured.
    (The models are loaded only when a probe is given: ``run --background`` is hot, §8.1.)"""
    if not any(raw[name] for name in _READY_NAMES):
        return None
    from procledger.domain.service import readiness_options

    with usage_errors():
        ready = readiness_options(
            port=raw["ready_port"],
            output=raw["ready_output"],
            file=raw["ready_file"],
            notify=bool(raw["ready_notify"]),
            timeout=raw["ready_timeout"],
        )
    if ready is not None and ready.output is not None and raw["no_capture"]:
        message = "needs the output captured (drop --no-capture)"
        raise UsageError(message, "--ready-output")
    return ready


def _restart(raw: Raw) -> RestartPolicy | None:
    """``--restart`` and its companions (docs/design.md §15.4)."""
    if all(raw[name] is None for name in _RESTART_NAMES):
        return None
    from procledger.domain.service import restart_options

    with usage_errors():
        return restart_options(
            restart=raw["restart"],
            max_restarts=raw["max_restarts"],
            window=raw["restart_window"],
            backoff_initial=raw["backoff_initial"],
            backoff_max=raw["backoff_max"],
            reset_after=raw["reset_after"],
        )


def _wait_ready(raw: Raw) -> bool:
    if raw["wait_ready"] and not raw["background"]:
        raise UsageError("only with --background", "--wait-ready")
    return bool(raw["wait_ready"])


_BACKGROUND = _switch(
    "background",
    "--background",
    "Hand it to this ledger's host agent (started if need be): it outlives this command "
    "and its terminal, its output is kept (see logs), its stdin is /dev/null; print the "
    "process id once it runs and return 0.",
)
_GRACE = _text(
    "grace",
    "--grace",
    "S",
    "Seconds between stop signals (finite, 0 to 86400).  [default: 10]",
    "10",
)
_STOP_SIGNAL = _text(
    "stop_signal",
    "--stop-signal",
    "SIG",
    "Sent after SIGINT's grace on Ctrl-C (then SIGKILL after another grace).  [default: TERM]",
    "TERM",
)
_STDIN = _text(
    "stdin",
    "--stdin",
    "inherit|null|pipe|PATH",
    "The command's stdin: this terminal or pipe (inherit; the default in the foreground), "
    "/dev/null (null; the default with --background), a pipe the agent holds for send "
    "(pipe; --background only), or a file.",
)
_JSON = _switch(
    "as_json", "--json", "Print the final record as JSON (the command's stdout goes to stderr)."
)
_NO_CAPTURE = _switch(
    "no_capture", "--no-capture", "Keep none of the output (it still streams through)."
)
_OUTPUT_LIMIT = _text(
    "output_limit",
    "--output-limit",
    "SIZE",
    "Output kept across both streams (512KiB, 1MiB, 64MiB or bytes; 0 keeps nothing).  "
    "[default: 64MiB]",
    "64MiB",
)
_READY = (
    _text("ready_port", "--ready-port", "PORT", "Ready once a TCP connect to it succeeds."),
    _text(
        "ready_output", "--ready-output", "REGEX", "Ready once a line of stdout or stderr matches."
    ),
    _text("ready_file", "--ready-file", "PATH", "Ready once the path exists."),
    _switch(
        "ready_notify",
        "--ready-notify",
        "Ready once it sends READY=1 to $NOTIFY_SOCKET (sd_notify).",
    ),
    _text(
        "ready_timeout",
        "--ready-timeout",
        "DURATION",
        "Not ready in time (0.2s, 60s, 5m, 1h): stop the tree, end failed/ready_timeout.",
    ),
)
_WAIT_READY = _switch(
    "wait_ready",
    "--wait-ready",
    "With --background: return once it is ready (exit 1, saying why, if it ends first). "
    "Ctrl-C leaves it starting under the agent: its id is printed, exit 130.",
)
_RESTART = (
    _text(
        "restart",
        "--restart",
        "never|on-failure|always",
        "Start it again, as a new attempt, when it ends (on-failure: when it failed).",
    ),
    _text(
        "max_restarts",
        "--max-restarts",
        "N",
        "At most N restarts per --restart-window (then a crash_loop).  [default: 5]",
    ),
    _text(
        "restart_window",
        "--restart-window",
        "DURATION",
        "The window --max-restarts counts in.  [default: 60s]",
    ),
    _text(
        "backoff_initial",
        "--backoff-initial",
        "DURATION",
        "Wait before the first restart, doubling each time.  [default: 0.2s]",
    ),
    _text(
        "backoff_max",
        "--backoff-max",
        "DURATION",
        "The longest wait between attempts.  [default: 30s]",
    ),
    _text(
        "reset_after",
        "--reset-after",
        "DURATION",
        "Running (and ready) this long clears the restart count.",
    ),
)


_NAME = _text(
    "name",
    "--name",
    "NAME",
    "Run it as the service NAME: while one runs under that name, print its id and start "
    "nothing (every command that takes an id takes NAME).",
)
_REPLACE = _switch(
    "replace", "--replace", "With --name: stop the service running under NAME first."
)
_PORT = _text(
    "port",
    "--port",
    "auto|PORT",
    "Lease a port in the ledger (auto: a free one of $PROCLEDGER_PORT_RANGE, "
    "default 20000-29999), pass it as $PORT, and be ready once it accepts connections.",
)


def _name(raw: Raw) -> str | None:
    name = raw["name"]
    if name is None:
        if raw["replace"]:
            raise UsageError("only with --name", "--replace")
        return None
    from procledger.domain.service_names import check_service_name

    with usage_errors():
        return check_service_name(name, "--name")


def _port(raw: Raw) -> int | Literal["auto"] | None:
    port = raw["port"]
    if port is None or port == "auto":
        return "auto" if port == "auto" else None
    from procledger.domain.durations import check_port

    with usage_errors():
        return check_port(port, option="--port")


_PTY = (
    _switch(
        "pty",
        "--pty",
        "Run it on a pseudo-terminal this run relays (its stdout and stderr one stream, kept "
        "as stdout): a REPL, an editor, a pager or a password prompt works as without "
        "procledger, and Ctrl-C, Ctrl-Z and resizes reach it. The default when stdin and "
        "stdout are terminals, without --json or --stdin.",
    ),
    _switch(
        "no_pty", "--no-pty", "Never a pseudo-terminal: its stdin is passed on through a pipe."
    ),
)


def _pty(raw: Raw) -> bool | None:
    """``--pty``/``--no-pty``: ``None`` leaves it to the run (a terminal on stdin and stdout,
    without ``--json``); ``--stdin`` names the command's input, so a pseudo-terminal -- which
    is its input -- is then ruled out, and with ``--pty`` refused."""
    if raw["pty"] and raw["no_pty"]:
        raise UsageError("not with --no-pty", "--pty")
    if raw["pty"] and raw["stdin"] is not None:
        message = "not with --stdin: the pseudo-terminal is the command's stdin"
        raise UsageError(message, "--pty")
    if raw["pty"] or raw["no_pty"]:
        return bool(raw["pty"])
    return False if raw["stdin"] is not None else None


_READY_NAMES = tuple(option.dest for option in _READY)
_RESTART_NAMES = tuple(option.dest for option in _RESTART)


@dataclass(frozen=True, slots=True)
class RunOptions:
    """`run`'s options, parsed and checked: what a run -- foreground or background -- needs.
    Each field names the flags that set it and how their text becomes its value."""

    command: tuple[str, ...] = field(
        metadata=_cli(parse=lambda raw: checked_command(raw["command"]))
    )
    background: bool = field(metadata=_cli(_BACKGROUND, parse=lambda raw: bool(raw["background"])))
    grace_s: float = field(metadata=_cli(_GRACE, parse=lambda raw: grace(raw["grace"])))
    stop_signal: signal.Signals = field(
        metadata=_cli(_STOP_SIGNAL, parse=lambda raw: parse_signal(raw["stop_signal"]))
    )
    stdin: StdinSource = field(
        metadata=_cli(_STDIN, parse=lambda raw: parse_stdin(raw["stdin"], bool(raw["background"])))
    )
    as_json: bool = field(metadata=_cli(_JSON, parse=lambda raw: bool(raw["as_json"])))
    capture: bool = field(metadata=_cli(_NO_CAPTURE, parse=lambda raw: not raw["no_capture"]))
    output_limit: int = field(
        metadata=_cli(_OUTPUT_LIMIT, parse=lambda raw: parse_size(raw["output_limit"]))
    )
    ready: Readiness | None = field(metadata=_cli(*_READY, parse=_readiness))
    wait_ready: bool = field(metadata=_cli(_WAIT_READY, parse=_wait_ready))
    restart: RestartPolicy | None = field(metadata=_cli(*_RESTART, parse=_restart))
    name: str | None = field(metadata=_cli(_NAME, parse=_name))
    replace: bool = field(metadata=_cli(_REPLACE, parse=lambda raw: bool(raw["replace"])))
    port: int | Literal["auto"] | None = field(metadata=_cli(_PORT, parse=_port))
    pty: bool | None = field(default=None, metadata=_cli(*_PTY, parse=_pty))

    @classmethod
    def parse(cls, raw: Raw) -> RunOptions:
        """The options ``raw`` names, each field parsed and checked once, in
        ``--help`` order with the command last; the first refusal is a usage error."""
        ordered = [*fields(cls)[1:], fields(cls)[0]]
        values = {spec.name: spec.metadata["parse"](raw) for spec in ordered}
        return cls(**values)


RUN_PARAMS: tuple[Option | Argument, ...] = (
    *(flag for spec in fields(RunOptions)[1:] for flag in spec.metadata["flags"]),
    Argument("command", "CMD", "The command and its arguments.", rest=True),
)
"""``run``'s options in ``--help`` order, then the command's words (``cli.table.RUN``)."""
