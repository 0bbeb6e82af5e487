"""A process in a few words, for people: its outcome, how it ended, its command line on one
line. Shared by the CLI's tables (docs/design.md §8) and the web view (§16), so both say the
same thing; pure text, no I/O. Each takes the model or its JSON document: the CLI's hot commands
read documents and never build a model (§8.1)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from procledger.domain.vocabulary import ProcessState

if TYPE_CHECKING:
    from procledger.domain.records import ProcessEvent, ProcessRecord

Document = Mapping[str, Any]
"""A record or an event as its JSON document (what the ledger stores, what ``--json`` prints)."""
_EVENT_KEYS = ("state", "reason", "exit_code", "signal", "diagnostic")
_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\", "'": "\\'"}


def local_time(ms: int | None) -> str:
    """The ledger keeps UTC milliseconds; people read their own time zone (the machine's: a
    terminal's for `ps`, the server's for the web view), to the second."""
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")  # local, naive


def outcome(record: ProcessRecord | Document) -> str:
    """The exit code when the process exited by itself, otherwise why it ended (if it did),
    with the signal that ended it."""
    document = _facts(record)
    if document["state"] == ProcessState.exited.value:
        return f"exit {document['exit_code']}"
    text = document.get("reason") or ""
    signal = document.get("signal")
    return f"{text} (signal {signal})" if signal else text


def ending(record: ProcessRecord | Document) -> str:
    """How the process ended in a few words: ``exited (exit 3)``, ``terminated (signal 15)``,
    ``lost_on_restore``."""
    document = _facts(record)
    signal = document.get("signal")
    if document["state"] == ProcessState.exited.value:
        return f"exited (exit {document['exit_code']})"
    return str(document["state"]) + (f" (signal {signal})" if signal else "")


def _facts(record: ProcessRecord | Document) -> Mapping[str, Any]:
    """A record's state, exit code, reason and signal as its JSON document has them: the CLI
    passes the stored document, the web view the model."""
    if isinstance(record, Mapping):
        return record
    reason = record.reason
    return {
        "state": record.state.value,
        "exit_code": record.exit_code,
        "reason": None if reason is None else reason.value,
        "signal": getattr(record, "signal", None),
    }


def shell_word(word: str) -> str:
    """One word as a shell reads it, always on one line: control characters are written as
    ``$'...'`` escapes (so an argv with newlines is still one line), the rest as shlex does."""
    if word.isprintable():
        return shlex.quote(word)
    escaped = "".join(_ESCAPES.get(ch) or (ch if ch.isprintable() else _hex(ch)) for ch in word)
    return f"$'{escaped}'"


def _hex(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def command_text(record: ProcessRecord | Document) -> str:
    """A command line a shell would accept, on one line; work without argv shows its label or
    kind."""
    if isinstance(record, Mapping):
        argv, identity = record["input"].get("argv"), record["identity"]
        label, kind = identity.get("label"), identity["kind"]
    else:
        argv, label, kind = record.input.argv, record.identity.label, record.identity.kind
    if not argv:
        return str(label or kind)
    return " ".join(shell_word(word) for word in argv)


def event_details(event: ProcessEvent | Document, *, with_payload: bool = False) -> str:
    """The fields a person scans an event history for, as ``key=value`` on one line (the rest
    is in the JSON): state, reason, exit code, signal, diagnostic, the child's pid (and who
    stopped a kept orphan), the owner;
    ``with_payload`` adds a producer event's payload (the web page has no JSON beside it)."""
    given, replay_key = (
        (event["payload"], event["replay_key"])
        if isinstance(event, Mapping)
        else (event.payload, event.replay_key)
    )
    payload = given if isinstance(given, dict) else {"payload": given}
    parts = [f"{k}={payload[k]}" for k in _EVENT_KEYS if payload.get(k) is not None]
    facts = payload.get("os")
    if isinstance(facts, dict) and facts.get("pid"):
        parts.append(f"pid={facts['pid']}")
    if isinstance(payload.get("pid"), int):  # a kept orphan stopped (``orphan_stopped``)
        parts.append(f"pid={payload['pid']} by={payload.get('by')}")
    owner = payload.get("owner")
    if isinstance(owner, dict) and owner.get("owner_id"):
        parts.append(f"owner={owner['owner_id']}")
    if with_payload and replay_key is not None:
        parts.append(f"payload={payload}")
    return " ".join(" ".join(parts).split())
