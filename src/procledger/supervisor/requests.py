"""A start's arguments, checked and normalised before anything is written (docs/design.md §6.2):
a bad argument is the caller's error, raised before the ledger holds a trace of it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import os
import subprocess
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from procledger.domain.registration import (
    ENV_REF_PREFIX,
    env_ref_for,
)
from procledger.domain.service import Readiness, RestartPolicy, check_port
from procledger.domain.service_names import check_service_name
from procledger.domain.vocabulary import MAX_LEDGER_INT, RecoveryDisposition
from procledger.supervisor.capture import DEFAULT_OUTPUT_LIMIT
from procledger.supervisor.execution import Consumer, StopPolicy, checked_argv
from procledger.supervisor.terminal import DEFAULT_SIZE, TerminalSize

__all__ = [
    "NotifyTo",
    "SessionIdLike",
    "StartRequest",
    "Stdin",
    "checked_request",
    "inherited_env_ref",
    "opened",
    "stdin_source",
]

Stdin = Literal["inherit", "null"] | Path | bytes | int
"""What a child reads: ``"null"`` (``/dev/null``), ``"inherit"`` (the supervisor's own stdin:
a pipe or a file — a terminal only if the child never reads it, since the child runs in a
process group of its own and a read from the terminal would stop it), a file's ``Path``,
``bytes`` written once and then closed, or an open file descriptor (e.g. the read end of a
pipe the caller feeds; the caller keeps and closes its own copy)."""

SessionIdLike = uuid.UUID | str
NotifyTo = tuple[uuid.UUID, uuid.UUID]
"""Where a completion notification goes: (session id, loop id)."""


@dataclass(frozen=True, slots=True)
class StartRequest:
    """``start``'s arguments, checked and normalised before anything is written."""

    args: list[str]
    process_id: str | None
    cwd: str | os.PathLike[str] | None
    env: Mapping[str, str] | None
    stdin: Stdin
    stdout: Consumer | None
    background: bool
    disposition: RecoveryDisposition
    session_id: uuid.UUID | None
    loop_id: uuid.UUID | None
    capture: bool = True
    output_limit: int = DEFAULT_OUTPUT_LIMIT
    ready: Readiness | None = None
    restart: RestartPolicy | None = None
    attempt_of: str | None = None
    attempt: int | None = None
    stop: StopPolicy | None = None
    # docs/design.md §19: a named service, its file definition's digest, a port to lease
    # (``"auto"``: one of ``port_range``), and when a later attempt's backoff ends.
    name: str | None = None
    digest: str | None = None
    port: int | Literal["auto"] | None = None
    port_range: tuple[int, int] | None = None
    starts_at_ms: int | None = None
    pty: TerminalSize | None = None  # docs/design.md §20: run on a pseudo-terminal this size

    @property
    def notify_to(self) -> NotifyTo | None:
        """A completion notification is published only where both ids name its target."""
        if self.session_id is None or self.loop_id is None:
            return None
        return (self.session_id, self.loop_id)

    @property
    def workdir(self) -> str:
        """The absolute directory the child runs in (the caller's, if none was named)."""
        return os.path.abspath(os.fspath(self.cwd) if self.cwd is not None else os.getcwd())


def checked_request(argv: Sequence[str], **options: Any) -> StartRequest:
    """``start``'s arguments checked and normalised, before anything is written."""
    capture, restart = bool(options["capture"]), options["restart"]
    if restart is not None and not isinstance(restart, RestartPolicy):
        raise TypeError(f"restart must be a procledger.RestartPolicy, not {restart!r}")
    return StartRequest(
        args=checked_argv(argv),
        process_id=options["process_id"],
        cwd=options["cwd"],
        env=options["env"],
        stdin=_checked_stdin(options["stdin"]),
        stdout=options["stdout"],
        background=options["background"],
        disposition=RecoveryDisposition(options["disposition"]),
        session_id=_uuid_or_none(options["session_id"]),
        loop_id=_uuid_or_none(options["loop_id"]),
        capture=capture,
        output_limit=_checked_limit(options["output_limit"]),
        ready=_checked_ready(options["ready"], capture),
        restart=restart,
        attempt=_attempt(options.get("process_id"), options.get("attempt_of"), restart),
        attempt_of=options.get("attempt_of"),
        stop=_checked_stop(options.get("stop")),
        name=_checked_name(options.get("name")),
        digest=options.get("digest"),
        port=_checked_port(options.get("port")),
        port_range=_checked_range(options.get("port_range")),
        pty=_checked_pty(options.get("pty"), options["stdin"]),
    )


def _checked_pty(pty: object, stdin: object) -> TerminalSize | None:
    """``pty``: ``True`` (24x80), a ``TerminalSize``, or false; its terminal is the child's
    stdin, so no other stdin may be named with it."""
    if pty is None or pty is False:
        return None
    size = DEFAULT_SIZE if pty is True else pty
    if not isinstance(size, TerminalSize):
        raise TypeError(f"pty must be a bool or a procledger.TerminalSize, not {pty!r}")
    if stdin != "null":
        raise ValueError(
            f"stdin={stdin!r} with pty: the terminal is the child's stdin; "
            "give it input with send()"
        )
    return size


def _attempt(process_id: object, attempt_of: object, restart: object) -> int | None:
    """A service's attempt number: 1, or -- resuming a service (``attempt_of``, §19) -- the
    number its id ``<attempt_of>.<n>`` carries."""
    if attempt_of is None:
        return None if restart is None else 1
    if restart is None or not isinstance(attempt_of, str) or not isinstance(process_id, str):
        raise ValueError("attempt_of: resuming a service needs its restart policy and process_id")
    number = process_id.removeprefix(f"{attempt_of}.")
    if number == process_id or not number.isdigit() or number.startswith("0") or number == "1":
        raise ValueError(f"process_id: {process_id!r} is not a later attempt of {attempt_of!r}")
    return int(number)


def _checked_name(name: object) -> str | None:
    if name is None:
        return None
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, not {name!r}")
    return check_service_name(name, "name")


def _checked_port(port: object) -> int | Literal["auto"] | None:
    if port is None or port == "auto":
        return "auto" if port == "auto" else None
    if isinstance(port, bool) or not isinstance(port, int):
        raise TypeError(f"port must be an int or 'auto', not {port!r}")
    return check_port(port, option="port")


def _checked_range(port_range: object) -> tuple[int, int] | None:
    if port_range is None:
        return None
    if not isinstance(port_range, tuple | list) or len(port_range) != 2:
        raise TypeError(f"port_range must be (low, high), not {port_range!r}")
    low, high = (check_port(bound, option="port_range") for bound in port_range)
    if low > high:
        raise ValueError(f"port_range: {low}-{high} is empty (the low end is above the high)")
    return int(low), int(high)


def _checked_stop(stop: object) -> StopPolicy | None:
    if stop is not None and not isinstance(stop, StopPolicy):
        raise TypeError(f"stop must be a procledger.StopPolicy, not {stop!r}")
    return stop


def opened(
    signature: inspect.Signature,
    sources: contextlib.ExitStack,
    argv: Sequence[str],
    options: Mapping[str, Any],
) -> tuple[StartRequest, int | None]:
    """A start given as ``(argv, options)`` checked as ``start`` checks its own arguments (an
    unknown option is the ``TypeError`` the call would raise; ``signature`` is ``start``'s),
    and its stdin source opened in ``sources``."""
    bound = signature.bind(None, argv, **options)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    del arguments["self"], arguments["argv"]
    request = checked_request(argv, **arguments)
    return request, sources.enter_context(stdin_source(request.stdin))


def _uuid_or_none(value: SessionIdLike | None) -> uuid.UUID | None:
    if value is None or isinstance(value, uuid.UUID):
        return value
    return uuid.UUID(value)


def _checked_ready(ready: object, capture: bool) -> Readiness | None:
    """``start``'s ``ready``: a ``Readiness`` (an output probe needs the output captured)."""
    if ready is None:
        return None
    if not isinstance(ready, Readiness):
        raise TypeError(f"ready must be a procledger.Readiness, not {ready!r}")
    if ready.output is not None and not capture:
        raise ValueError("an output readiness probe needs the output captured (capture=True)")
    return ready


def _checked_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"output_limit must be an int (bytes), not {limit!r}")
    if not 0 <= limit <= MAX_LEDGER_INT:
        raise ValueError(f"output_limit must be from 0 to {MAX_LEDGER_INT} bytes, not {limit}")
    return limit


def _checked_stdin(stdin: object) -> Stdin:
    """``stdin`` if it is one of ``Stdin``'s forms; a plain string other than the two words
    is refused rather than guessed at (a path? data?)."""
    if stdin in ("inherit", "null") or isinstance(stdin, Path | bytes):
        return stdin
    if isinstance(stdin, int) and not isinstance(stdin, bool) and stdin >= 0:
        return stdin
    raise TypeError(
        f"stdin must be 'inherit', 'null', a pathlib.Path, bytes or a file descriptor, "
        f"not {stdin!r}"
    )


@contextmanager
def stdin_source(stdin: Stdin) -> Iterator[int | None]:
    """What the child reads when no bytes are written to it, open for the start only (the
    child keeps its own copy of a file's descriptor)."""
    if isinstance(stdin, Path):
        fd = os.open(stdin, os.O_RDONLY)
        try:
            yield fd
        finally:
            os.close(fd)
    elif stdin == "inherit":
        yield None
    elif isinstance(stdin, int) and not isinstance(stdin, bool):
        yield stdin
    else:
        yield subprocess.DEVNULL


def inherited_env_ref() -> str:
    """The env ref of this process's environment (what a child started without ``env``
    inherits), hashed again only when the environment changed: decoding, sorting and hashing
    every variable cost ~50 µs of each start."""
    if not os.supports_bytes_environ:
        return env_ref_for(dict(os.environ))
    return _env_ref_of(tuple(os.environb.items()))


@functools.lru_cache(maxsize=1)
def _env_ref_of(environment: tuple[tuple[bytes, bytes], ...]) -> str:
    """The env ref of an environment given as bytes pairs (decoded as ``os.environ`` does).

    A shell can export any bytes, and text that is not UTF-8 cannot be canonical JSON: such an
    environment is hashed as its sorted ``NAME=value`` bytes instead (NUL-separated; neither
    holds a NUL). Its values are never stored, so the ref only has to tell it apart."""
    try:
        return env_ref_for({os.fsdecode(name): os.fsdecode(value) for name, value in environment})
    except TypeError:  # orjson refuses the surrogate escape of a byte that is not UTF-8
        lines = b"\0".join(sorted(name + b"=" + value for name, value in environment))
        return f"{ENV_REF_PREFIX}{hashlib.sha256(lines).hexdigest()}"
