"""What a client asks of the agent over its socket (docs/design.md §18.3), checked as pydantic
models: a request that does not fit is an error reply naming the field, before anything is
written. The socket is a fast path, not a second source of truth: each order is carried out
through the ledger as a ``Supervisor`` would.
"""

from __future__ import annotations

import signal
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from procledger.domain.service import Readiness, RestartPolicy
from procledger.domain.vocabulary import MAX_LEDGER_INT

__all__ = [
    "KeysOrder",
    "OrderError",
    "ReadOrder",
    "ResourcesOrder",
    "SendOrder",
    "ShutdownOrder",
    "StartOrder",
    "StopOrder",
    "checked",
]


class _Order(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StartOrder(_Order):
    """``run --background``: the command, where and with what it runs, and how it is kept.
    ``env`` is the caller's environment (the child's, as if the caller had spawned it);
    ``stdin`` ``null``, ``pipe`` (the agent holds its write end: ``send``) or an absolute path
    to a readable file; ``pty`` ``[rows, cols]``: run it on a pseudo-terminal (§20)."""

    op: Literal["start"] = "start"
    argv: list[str] = Field(min_length=1)
    process_id: str = Field(min_length=1, max_length=200)
    cwd: str = Field(min_length=1)
    env: dict[str, str]
    stdin: str = "null"
    capture: bool = True
    output_limit: Annotated[int, Field(ge=0, le=MAX_LEDGER_INT)] = 64 * 1024 * 1024
    ready: Readiness | None = None
    restart: RestartPolicy | None = None
    stop_signal: Annotated[int, Field(ge=1, le=64)] = int(signal.SIGTERM)
    grace_s: Annotated[float, Field(ge=0, le=86_400)] = 10.0
    # docs/design.md §19: a named service, the digest of its file definition, a leased port;
    # ``attempt_of``: the start is that service's next attempt (brought back after a takeover).
    name: str | None = None
    attempt_of: str | None = Field(default=None, min_length=1, max_length=200)
    digest: str | None = Field(default=None, max_length=200)
    port: Annotated[int, Field(ge=1, le=65535)] | Literal["auto"] | None = None
    port_range: (
        tuple[Annotated[int, Field(ge=1, le=65535)], Annotated[int, Field(ge=1, le=65535)]] | None
    ) = None
    pty: (
        tuple[Annotated[int, Field(ge=1, le=65535)], Annotated[int, Field(ge=1, le=65535)]] | None
    ) = None


class StopOrder(_Order):
    """Look for stop requests now: one was just recorded for ``process_id`` (the ledger holds
    the request; this only saves the agent's poll interval)."""

    op: Literal["stop"] = "stop"
    process_id: str = Field(min_length=1, max_length=200)


class ReadOrder(_Order):
    """A hot command's read (``application.document_reads.LedgerReads``, docs/design.md §8.1):
    on a PostgreSQL ledger the CLI asks the agent, which holds the connections, rather than
    loading psycopg for one query."""

    op: Literal["read"] = "read"
    method: Literal[
        "record",
        "resolve",
        "newest_first",
        "changes_since",
        "events",
        "attempts",
        "newest_attempt",
        "holders",
        "wanted_up",
    ]
    args: list[object] = Field(max_length=4)


class ResourcesOrder(_Order):
    """``ps --resources``: the latest sample of each running child's tree (docs/design.md
    §18.10), of ``process_ids`` (every child's, with ``None``)."""

    op: Literal["resources"] = "resources"
    process_ids: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        default=None, max_length=10_000
    )


class SendOrder(_Order):
    """``send``: input for a session's terminal or stdin pipe, journalled as ``input_sent``
    under ``command_id`` before it is written (docs/design.md §20.2). ``data`` is base64."""

    op: Literal["send"] = "send"
    process_id: str = Field(min_length=1, max_length=200)
    data: str = Field(max_length=90_000)
    command_id: str = Field(min_length=1, max_length=200)
    eof: bool = False
    redact: bool = False


class KeysOrder(_Order):
    """``attach``: what was typed, written as it is -- keystrokes are not journalled (a
    terminal's typing is not a command; ``send`` is) -- and the window's size, if it changed."""

    op: Literal["keys"] = "keys"
    process_id: str = Field(min_length=1, max_length=200)
    data: str = Field(default="", max_length=90_000)
    size: (
        tuple[Annotated[int, Field(ge=1, le=65535)], Annotated[int, Field(ge=1, le=65535)]] | None
    ) = None


class ShutdownOrder(_Order):
    """``agent stop``: leave the children running (the next agent adopts them), or stop each
    and record how it ended."""

    op: Literal["shutdown"] = "shutdown"
    stop_children: bool = False


OrderT = TypeVar("OrderT", bound=_Order)


class OrderError(ValueError):
    """A request that is not an order of its op: the first problem, with its field."""


def checked(kind: type[OrderT], request: dict[str, object]) -> OrderT:
    """``request`` as ``kind``, or ``OrderError`` naming the first field at fault."""
    try:
        return kind.model_validate(request)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "request"
        raise OrderError(f"{where}: {first['msg']}") from None
