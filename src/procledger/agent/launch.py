"""Reaching a ledger's agent from a client (the CLI): finding it, starting it on demand, asking
it to stop (docs/design.md §18.5).

``ensure_agent`` is what ``run --background`` calls: a ping over the socket when the agent runs
(well under a millisecond), else the anchor started detached -- in a session of its own, its
output appended to the agent's log -- and the socket awaited. Two clients racing to start it make
one agent: the start is taken under a lock file, and the socket's own lock would refuse a second
agent anyway.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from procledger.adapters.sql.location import locate, store_key
from procledger.agent.anchor import ALREADY_SERVED
from procledger.agent.control_client import START_REQUEST_BYTES, request
from procledger.agent.places import AgentPlaces
from procledger.domain.errors import (
    AgentError,
    AgentNotRunning,
    AgentSocketError,
    AgentStartError,
    ProcledgerError,
)

__all__ = [
    "ALREADY_SERVED",
    "agent_argv",
    "anchor_argv",
    "ask",
    "ensure_agent",
    "ledger_key",
    "ping",
    "resource_samples",
    "tell_of_stop",
    "unit_text",
]


START_TIMEOUT_S: Final = 20.0
"""How long a client waits for a freshly started agent to answer (a first start imports the
whole stack and takes over; on a loaded machine seconds)."""

LOG_KEEP_BYTES: Final = 1024 * 1024
"""The agent's log is set aside (``agent.log.1``) past this size, at the next start."""


def ledger_key(url: str | None) -> str:
    """The store key naming ``url``'s ledger (``$PROCLEDGER_URL`` or the default when None).

    Raises:
        StoreURLError: the URL is malformed.
        AgentStartError: an in-memory ledger, which no agent can share.
    """
    key = store_key(locate(url))
    if key is None:
        raise AgentStartError(
            "an in-memory ledger cannot be shared with an agent: use a SQLite file"
        )
    return key


def ping(places: AgentPlaces, timeout: float = 2.0) -> dict[str, Any] | None:
    """The agent's answer to ``ping``, or ``None`` when none runs. One that accepted and then
    closed unanswered was dying as it was asked (a SIGKILL, or a stop closing its socket, with
    the connection in its backlog): no agent either."""
    try:
        answer: dict[str, Any] = request(places.socket, {"op": "ping"}, timeout=timeout)
    except AgentNotRunning:
        return None
    except AgentError as error:
        if error.type != "ConnectionClosed":
            raise
        return None
    return answer


def ask(places: AgentPlaces, doc: dict[str, Any], timeout: float = 5.0) -> Any:
    """One request to the running agent (``AgentNotRunning`` when none runs)."""
    return request(places.socket, doc, timeout=timeout, max_bytes=START_REQUEST_BYTES)


def tell_of_stop(key: str | None, process_id: str) -> bool:
    """Tell this host's agent of the ledger ``key`` (a store key; None: an in-memory ledger,
    which has none) that a stop of ``process_id`` was just recorded, so it carries it out now
    rather than at its next poll; whether an agent took the word. Never raises: the request is
    on record, and the agent finds it anyway (docs/design.md §18.5)."""
    if key is None:
        return False
    try:
        places = AgentPlaces.of(key, create=False)
        ask(places, {"op": "stop", "process_id": process_id}, timeout=STOP_WORD_TIMEOUT_S)
    except (AgentSocketError, ProcledgerError, OSError):
        return False
    return True


STOP_WORD_TIMEOUT_S: Final = 2.0
"""How long a `stop` waits for the agent to take its word (it answers in a millisecond)."""


SAMPLES_TIMEOUT_S: Final = 2.0
"""The agent answers a ``resources`` op from memory in a millisecond; a busy machine may take
longer."""


def resource_samples(
    key: str | None, process_ids: list[str], timeout: float = SAMPLES_TIMEOUT_S
) -> dict[str, dict[str, Any]]:
    """The latest sample this host's agent of the ledger ``key`` (a store key; None: in
    memory, which has none) holds of each of ``process_ids`` -- its ``resources`` op
    (docs/design.md §18.10); ``{}`` when no agent answers. Never raises: a sample is a
    glimpse, and `ps --resources` and the web view show none rather than fail."""
    if key is None or not process_ids:
        return {}
    try:
        places = AgentPlaces.of(key, create=False)
        answer = ask(places, {"op": "resources", "process_ids": process_ids}, timeout=timeout)
    except (ProcledgerError, OSError):
        return {}
    samples = answer.get("samples") if isinstance(answer, dict) else None
    return samples if isinstance(samples, dict) else {}


def agent_argv() -> list[str]:
    """The agent itself (``python -m procledger.agent``), run by this interpreter."""
    return [sys.executable, "-m", "procledger.agent"]


def anchor_argv(places: AgentPlaces) -> list[str]:
    """The anchor, which starts the agent (and starts it again) where Linux gives a subreaper;
    elsewhere the agent alone (docs/design.md §18.6 says what is weaker there)."""
    if not sys.platform.startswith("linux"):
        return agent_argv()
    anchor = [sys.executable, "-m", "procledger.agent.anchor", "--journal", str(places.journal)]
    return [*anchor, "--", *agent_argv()]


def ensure_agent(url: str | None, places: AgentPlaces | None = None) -> tuple[AgentPlaces, bool]:
    """The places of ``url``'s running agent, started if need be; and whether it was started
    now.

    Raises:
        AgentStartError: it could not be started (the reason and the log's last lines).
        AgentSocketError: its socket folder is not private.
    """
    places = places or AgentPlaces.of(ledger_key(url))
    if ping(places) is not None:
        return places, False
    with _start_lock(places):
        if ping(places) is not None or _restarted(places):
            return places, False
        _spawn_detached(url, places)
    return places, True


def _restarted(places: AgentPlaces) -> bool:
    """The agent died but its anchor lives and starts it again (after its backoff): wait for
    that agent rather than start a second anchor, which the journal's lock would refuse (and
    whose pid would then hide the live anchor's in ``anchor.pid``). False when no anchor
    runs, or it ended while waited for."""
    anchor = _live_anchor(places)
    if anchor is None:
        return False
    deadline = time.monotonic() + START_TIMEOUT_S
    pause = 0.005
    while ping(places, timeout=1.0) is None:
        if _live_anchor(places) != anchor:
            return False  # the anchor ended too: a new one must be started
        if time.monotonic() >= deadline:
            raise AgentStartError(
                f"the agent's anchor (pid {anchor}) did not start it again within "
                f"{START_TIMEOUT_S:g} s; its log, {places.log}, ends: {_log_tail(places.log)}"
            )
        time.sleep(pause)  # another process's restart: nothing here can wait on it
        pause = min(pause * 2, 0.1)
    return True


def _live_anchor(places: AgentPlaces) -> int | None:
    """The pid ``anchor.pid`` names if that process is this ledger's anchor and runs (its
    command line names the anchor and this journal: a reused pid does not)."""
    try:
        pid = int(places.anchor_pidfile.read_text())
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            argv = file.read().split(b"\0")
    except (OSError, ValueError):
        return None
    journal = os.fsencode(places.journal)
    if b"procledger.agent.anchor" in argv and journal in argv:
        return pid
    return None


@contextlib.contextmanager
def _start_lock(places: AgentPlaces) -> Iterator[None]:
    fd = os.open(places.start_lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _spawn_detached(url: str | None, places: AgentPlaces) -> None:
    """Start the anchor (and so the agent) in a session of its own, away from this terminal,
    and wait until the agent answers."""
    _set_log_aside(places.log)
    env = dict(os.environ)
    if url is not None:
        env["PROCLEDGER_URL"] = url  # never on a command line: every user can read those
    with open(places.log, "ab") as log, open(os.devnull, "rb") as null:
        child = subprocess.Popen(
            anchor_argv(places),
            stdin=null,
            stdout=log,
            stderr=log,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    places.anchor_pidfile.write_text(f"{child.pid}\n")
    deadline = time.monotonic() + START_TIMEOUT_S
    pause = 0.005
    while ping(places, timeout=1.0) is None:
        ended = child.poll()
        if ended is not None or time.monotonic() >= deadline:
            why = f"it exited with status {ended}" if ended is not None else "it did not answer"
            raise AgentStartError(
                f"the agent could not be started ({why} within {START_TIMEOUT_S:g} s); "
                f"its log, {places.log}, ends: {_log_tail(places.log)}"
            )
        time.sleep(pause)  # a fresh interpreter importing the stack: nothing to wait on
        pause = min(pause * 2, 0.1)
    child.returncode = 0  # detached on purpose: not ours to reap (it outlives us)


def _set_log_aside(log: Path) -> None:
    with contextlib.suppress(OSError):
        if log.stat().st_size > LOG_KEEP_BYTES:
            log.replace(log.with_name(log.name + ".1"))


def _log_tail(log: Path, lines: int = 3) -> str:
    try:
        text = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty)"


def unit_text(url: str | None, places: AgentPlaces) -> str:
    """A systemd user unit that runs the anchor and the agent (``agent run``). ``KillMode=
    process``: stopping or restarting the unit stops the anchor and the agent, never the
    supervised children (the next agent adopts them)."""
    environment = ""
    if url is not None:
        environment = f"Environment=PROCLEDGER_URL={_systemd_quote(url)}\n"
    return (
        "[Unit]\n"
        f"Description=procledger agent for {places.key}\n"
        "Documentation=https://github.com/procledger/procledger\n\n"
        "[Service]\n"
        "Type=simple\n"
        f"{environment}"
        f"ExecStart={_systemd_quote(sys.executable)} -m procledger agent run\n"
        "KillMode=process\n"
        "Restart=on-failure\n"
        "RestartSec=1\n\n"
        "[Install]\n"
        "WantedBy=default.target\n"
    )


def _systemd_quote(text: str) -> str:
    if all(c.isalnum() or c in "/._-:@=+" for c in text):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'"{escaped}"'
