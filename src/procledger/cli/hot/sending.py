"""`send`: input for a background process, through this host's agent, which holds its terminal
or stdin pipe and journals each send before it writes it (docs/design.md §20.2).

A hot command: a harness sends hundreds of times in a task, so it pays neither typer nor
pydantic here -- the record is read as a stored document and the order is plain JSON.
"""

from __future__ import annotations

import base64
import os
import sys
import uuid
from argparse import Namespace
from typing import Any

from procledger.cli.hot import marks as marking
from procledger.cli.hot.opening import reading
from procledger.cli.hot.showing import scoped
from procledger.cli.lines import write_json, write_line
from procledger.cli.values import UsageError
from procledger.domain.errors import AgentError, AgentNotRunning, InputRefused

__all__ = ["MAX_SEND_BYTES", "agent_for", "live_target", "send"]

MAX_SEND_BYTES = 64 * 1024
"""As ``domain.input.MAX_INPUT_BYTES`` (not imported: that module loads the errors' pydantic
neighbours)."""


def send(options: Namespace, url: str | None, *, fast: bool) -> int:
    data = _payload(options)
    command_id = options.command_id or f"send-{uuid.uuid4().hex}"
    process_id = live_target(url, options.process_id, fast=fast)
    order = {
        "op": "send",
        "process_id": process_id,
        "data": base64.b64encode(data).decode("ascii"),
        "command_id": command_id,
        "eof": bool(options.eof),
        "redact": bool(options.redact),
    }
    applied = bool(agent_for(url, process_id, order)["applied"])
    if options.as_json:
        write_json({"process_id": process_id, "command_id": command_id, "applied": applied,
                    "size": len(data)})  # fmt: skip
    elif not applied:
        write_line(f"already sent as command {command_id}: nothing written again")
    return 0


def live_target(url: str | None, text: str, *, fast: bool) -> str:
    """The running process ``text`` names (a service's name or first id: its newest
    attempt); ``InputRefused`` for one that ended."""
    with reading(url, fast=fast) as reads:
        record, whole = scoped(reads, text)
        if whole:
            record = reads.newest_attempt(record["id"])
    if marking.is_terminal(record):
        raise InputRefused(
            f"process {record['id']} has ended ({record['state']}): it takes no more input"
        )
    return str(record["id"])


def agent_for(url: str | None, process_id: str, order: dict[str, Any]) -> Any:
    """``order`` carried out by this host's agent of the ledger; its error said as the
    error it names."""
    from procledger.agent.launch import ask, ledger_key
    from procledger.agent.places import AgentPlaces
    from procledger.cli.hot.agent_reads import raised_again

    try:
        return ask(AgentPlaces.of(ledger_key(url)), order, timeout=15.0)
    except AgentNotRunning:
        raise InputRefused(
            f"process {process_id}: no agent runs on this host for its ledger, so nobody "
            "holds its input (was it started here with run --background?)"
        ) from None
    except AgentError as error:
        raise raised_again(error, fallback=error) from None


def _payload(options: Namespace) -> bytes:
    """TEXT, --file's bytes, or standard input's (when it is not a terminal)."""
    if options.text is not None and options.file is not None:
        raise UsageError("give TEXT or --file, not both", "--file")
    if options.file is not None:
        data = _read_file(options.file)
    elif options.text is not None:
        data = os.fsencode(options.text)
    elif not sys.stdin.isatty() and not options.eof:
        data = sys.stdin.buffer.read(MAX_SEND_BYTES + 1)
    else:
        data = b""
    data += b"\n" if options.line else b""
    if len(data) > MAX_SEND_BYTES:
        raise UsageError(f"one send carries at most {MAX_SEND_BYTES} bytes", "TEXT")
    if not data and not options.eof:
        raise UsageError("nothing to send: give TEXT, --file, --line or --eof", "TEXT")
    return data


def _read_file(path: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read(MAX_SEND_BYTES + 1)
    except OSError as error:
        raise UsageError(f"cannot read {path!r}: {error.strerror}", "--file") from None
