"""A process in a few words, for people: its outcome, how it ended, its command line on one
line, a service's attempt and backoff. Shared by the CLI's tables (docs/design.md §8) and the
web view (§16), so both say the same thing; pure text, no I/O. Each takes the model or its JSON
document: the CLI's hot commands read documents and never build a model (§8.1)."""

from __future__ import annotations

import base64
import shlex
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from procledger.domain.probe_names import probe_names
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


def _field(record: ProcessRecord | Document, name: str) -> Any:
    """One field as the JSON document has it (an enum as its value)."""
    value = record.get(name) if isinstance(record, Mapping) else getattr(record, name)
    return getattr(value, "value", value)


def in_backoff(record: ProcessRecord | Document, now_ms: int) -> bool:
    """Whether ``record`` is a service's next attempt that waits out its backoff: registered
    (``starting``) at once when the attempt before ended, but spawned only at ``starts_at_ms``
    (docs/design.md §15.4). Past that time it is being spawned, no longer waiting."""
    starts_at = _field(record, "starts_at_ms")
    return _field(record, "state") == "starting" and starts_at is not None and starts_at > now_ms


def shown_state(record: ProcessRecord | Document, now_ms: int) -> str:
    """The state a list shows: ``backoff`` for an attempt waiting out its backoff (as
    supervisord's ``BACKOFF``), which the ledger records as ``starting``; else the state."""
    return "backoff" if in_backoff(record, now_ms) else str(_field(record, "state"))


def span(ms: int) -> str:
    """A stretch of time as a list shows it, short: ``1.2s``, ``29s``, ``4m05s``, ``2h03m``,
    ``3d04h`` (the web view's ages read the same)."""
    ms = max(ms, 0)
    seconds = ms // 1000
    if ms < 10_000:
        return f"{ms / 1000:.1f}s"
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86_400:
        return f"{seconds // 3600}h{seconds // 60 % 60:02d}m"
    return f"{seconds // 86_400}d{seconds // 3600 % 24:02d}h"


def clock_time(ms: int, now_ms: int) -> str:
    """A moment near now, in local time: the time of day alone when it is today."""
    when, today = datetime.fromtimestamp(ms / 1000), datetime.fromtimestamp(now_ms / 1000)
    return when.strftime("%H:%M:%S" if when.date() == today.date() else "%Y-%m-%d %H:%M:%S")


def next_attempt(record: ProcessRecord | Document, now_ms: int) -> str:
    """When a service's attempt in backoff starts: ``next attempt at 12:00:01 (in 1.2s)``."""
    starts_at = int(_field(record, "starts_at_ms"))
    return f"next attempt at {clock_time(starts_at, now_ms)} (in {span(starts_at - now_ms)})"


def listed_outcome(record: ProcessRecord | Document, now_ms: int) -> str:
    """A list's outcome cell: the outcome, and for a service's row which attempt it shows and
    whether the service gave up -- or, in a backoff, when the attempt starts (``next in 1.2s ·
    attempt 3``), which is what a person scanning the list needs to know of it."""
    attempt = _field(record, "attempt")
    waiting = _field(record, "waiting_for_input")
    if waiting is not None:  # what a person scanning the list must act on (§20.3)
        kind = waiting["kind"] if isinstance(waiting, Mapping) else waiting.kind
        return f"waiting for input ({kind})"
    if attempt is None:
        return outcome(record)
    if in_backoff(record, now_ms):
        return f"next in {span(int(_field(record, 'starts_at_ms')) - now_ms)} · attempt {attempt}"
    gave_up = _field(record, "gave_up")
    ended = outcome(record)
    note = f"attempt {attempt}" + (f", gave up ({gave_up})" if gave_up else "")
    return f"{ended} · {note}" if ended else note


def service_lines(
    record: Document, first: Document | None, attempts: int, now_ms: int
) -> list[tuple[str, str]]:
    """What `show` and the web view's process page say of a service beyond the record
    (docs/design.md §15, §19), as ``(name, value)`` lines: readiness; which attempt of how
    many (``attempts``); the policy; when the next attempt starts while it waits out its
    backoff; the leased port; why no attempt follows. ``first``, the service's first attempt,
    carries a stop of the whole service."""
    rows: list[tuple[str, str]] = []
    stopped = (first or record).get("service_stop_requested")
    if stopped:
        asked = ", ".join(stopped)
        rows.append(("service stop", f"requested ({asked}): no further attempt starts"))
    if record.get("readiness") is not None:
        ready_at = record.get("ready_at_ms")
        ready = "not ready" if ready_at is None else local_time(ready_at)
        probes = ", ".join(probe_names(record["readiness"]))
        rows.append(("ready", f"{ready} (probes: {probes})"))
    if record.get("attempt") is not None:
        rows.append(("attempt", f"{record['attempt']} of {max(attempts, 1)}"))
    if record.get("restart") is not None:
        policy = record["restart"]
        rows.append(("restart", f"{policy['mode']}, at most {policy['max_restarts']} per "
                                f"{float(policy['window_s']):g} s"))  # fmt: skip
    if in_backoff(record, now_ms):
        rows.append(("backoff", next_attempt(record, now_ms)))
    if record.get("port") is not None:
        rows.append(("port", str(record["port"])))
    if record.get("gave_up"):
        rows.append(("gave up", record["gave_up"]))
    return rows


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
    if isinstance(payload.get("pid"), int) and "by" in payload:  # a kept orphan stopped
        parts.append(f"pid={payload['pid']} by={payload.get('by')}")
    parts += _input_details(payload)
    owner = payload.get("owner")
    if isinstance(owner, dict) and owner.get("owner_id"):
        parts.append(f"owner={owner['owner_id']}")
    if with_payload and replay_key is not None:
        parts.append(f"payload={payload}")
    return " ".join(" ".join(parts).split())


def _input_details(payload: Mapping[str, Any]) -> list[str]:
    """An ``input_sent``'s size and bytes (shown escaped, or ``redacted``); a
    ``waiting_for_input``'s kind and last line (docs/design.md §20); what a
    ``resources_used`` counted."""
    if "command_id" in payload and "size" in payload:
        data = payload.get("data")
        sent = "redacted" if data is None else shell_word(_decoded(data))
        return [f"bytes={payload['size']}", f"data={sent}"] + (
            ["eof"] if payload.get("eof") else []
        )
    if "last_line" in payload and "kind" in payload:
        return [f"kind={payload['kind']}", f"last_line={shell_word(str(payload['last_line']))}"]
    if "peak_rss_bytes" in payload and "cpu_s" in payload:  # resources_used (§18.10)
        return [f"cpu_s={payload['cpu_s']}", f"peak_rss={size_text(payload['peak_rss_bytes'])}"]
    return []


def _decoded(data: str) -> str:
    return base64.b64decode(data).decode("utf-8", errors="backslashreplace")


def size_text(size: int) -> str:
    """Bytes as people read them: ``812K``, ``201.3M``, ``1.2G``."""
    if size < 1024**2:
        return f"{size // 1024}K"
    if size < 1024**3:
        return f"{size / 1024**2:.1f}M"
    return f"{size / 1024**3:.1f}G"


def resources_line(used: Document) -> str:
    """What an ended run's tree used, as the agent saw it (docs/design.md §18.10): ``show``'s
    line and the web's, the record's ``resources`` as its JSON document."""
    line = f"CPU {used['cpu_s']:.2f} s, peak RSS {size_text(used['peak_rss_bytes'])}"
    if used.get("open_files") is None:  # never sampled: what the kernel counted at its exit
        return f"{line} (counted at exit)"
    return (
        f"{line}, {used['open_files']} open files, {used['threads']} threads "
        f"(last sampled {local_time(used['sampled_at_ms'])})"
    )
