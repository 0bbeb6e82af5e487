"""The agent's end of the anchor's descriptor store (docs/design.md §18.9).

A PTY child dies of SIGHUP when the last descriptor of its pseudo-terminal's master closes, so
a master the agent alone holds dies with the agent — and the child must never depend on the
agent being alive (§18). The anchor keeps a duplicate of each descriptor the agent hands it,
for as long as the anchor lives, and hands them all to each agent it starts: systemd's file
descriptor store (``sd_notify`` ``FDSTORE=1``), between the anchor and its agent.

**Wire.** The anchor makes a ``socketpair(AF_UNIX, SOCK_SEQPACKET)`` for each agent it starts
and gives the agent its end as descriptor ``STORE_FD`` (3), named by ``STORE_VARIABLE``
(``PROCLEDGER_FD_STORE=3``) in its environment. Each message is one JSON object (ASCII, at most
``MAX_MESSAGE_BYTES``), descriptors riding along as ``SCM_RIGHTS``. The anchor speaks first:
``{"op":"held","key":K}`` with one descriptor for each it holds, then ``{"op":"end"}``. Then
the agent asks, one request at a time: ``{"op":"keep","key":K}`` with exactly one descriptor
(held from then on; a key already held is replaced and its old descriptor closed) or
``{"op":"drop","key":K}`` (closed and forgotten; an unknown key is fine), and the anchor
answers each ``{"ok":true}`` or ``{"ok":false,"error":"..."}``. A key is a non-empty string
of at most ``MAX_KEY_BYTES`` (256) bytes of UTF-8; the store holds ``MAX_HELD`` (8,192)
descriptors at most. Fields a side does not know are ignored, so either end can grow one
(the anchor outlives upgrades of the agent).

Standard library only (with the errors): the protocol's constants and checks are the
anchor's own (``anchor`` imports nothing of ours but the exit journal), imported from there.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterable, MutableMapping

from procledger.agent.anchor import (
    MAX_HELD,
    MAX_KEY_BYTES,
    MAX_MESSAGE_BYTES,
    STORE_FD,
    STORE_VARIABLE,
    encode,
    key_problem,
    receive_message,
)
from procledger.domain.errors import AgentSocketError

__all__ = [
    "MAX_HELD",
    "MAX_KEY_BYTES",
    "MAX_MESSAGE_BYTES",
    "STORE_FD",
    "STORE_VARIABLE",
    "FdStore",
    "FdStoreError",
]


class FdStoreError(AgentSocketError):
    """The anchor's descriptor store refused a request, did not answer, or cannot be reached;
    the message names the key or the descriptor at fault. After a timeout, whether the anchor
    holds the descriptor is unknown: keep it again (that replaces it) or drop it."""


class FdStore:
    """The agent's connection to the anchor's descriptor store. ``take_all`` first, once; then
    ``keep`` and ``drop`` from any thread (one request at a time, under a lock)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self._taken = False
        self._unanswered = 0
        """Requests whose reply a timeout left unread: read before the next request's."""

    @classmethod
    def from_environment(cls, environ: MutableMapping[str, str] = os.environ) -> FdStore | None:
        """The store the anchor gave this process, or None when none was (an agent started
        without an anchor: macOS, or by hand). The variable is removed from ``environ`` and
        the descriptor made close-on-exec at once: the agent's children must not inherit it.

        Raises:
            FdStoreError: the variable names no descriptor, or one that is not a SEQPACKET
                Unix socket.
        """
        text = environ.pop(STORE_VARIABLE, None)
        if text is None:
            return None
        try:
            fd = int(text)
            os.set_inheritable(fd, False)
            sock = socket.socket(fileno=fd)
        except (ValueError, OSError) as error:
            raise FdStoreError(f"{STORE_VARIABLE}={text!r} names no socket: {error}") from None
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_SEQPACKET:
            sock.detach()  # not ours to close: the variable lied
            raise FdStoreError(f"{STORE_VARIABLE}={text!r} is not a SEQPACKET Unix socket")
        return cls(sock)

    def take_all(self, timeout: float = 5.0) -> dict[str, int]:
        """Every descriptor the anchor holds, by key: the caller owns them (close-on-exec; the
        anchor keeps its own duplicates). Called once, before ``keep`` or ``drop``: the anchor
        sends them before any reply. A message it does not know is skipped.

        Raises:
            FdStoreError: called twice, or the anchor did not finish within ``timeout``
                seconds, or closed the store (then nothing received is kept open).
        """
        with self._lock:
            self._check_open()
            if self._taken:
                raise FdStoreError("take_all() was already called: the anchor hands over once")
            self._taken = True
            held: dict[str, int] = {}
            try:
                self._receive_held(held, time.monotonic() + timeout, timeout)
            except BaseException:
                _close_all(held.values())
                raise
            return held

    def keep(self, key: str, fd: int, timeout: float = 5.0) -> None:
        """Have the anchor hold a duplicate of ``fd`` under ``key`` (replacing what ``key``
        held); returns once it does. ``fd`` stays the caller's.

        Raises:
            FdStoreError: a bad key, a descriptor that cannot be sent, a refusal (the store is
                full, say), or no answer within ``timeout`` seconds.
        """
        self._check_key(key)
        with self._lock:
            deadline = self._ready(timeout)
            try:
                socket.send_fds(self._sock, [encode({"op": "keep", "key": key})], [fd])
            except OSError as error:
                why = error.strerror or error
                raise FdStoreError(f"cannot hand descriptor {fd} ({key!r}) over: {why}") from None
            self._await_reply(deadline, timeout, f"keep {key!r}")

    def drop(self, key: str, timeout: float = 5.0) -> None:
        """Have the anchor close and forget what ``key`` holds; nothing held is fine.

        Raises:
            FdStoreError: a bad key, a refusal, or no answer within ``timeout`` seconds.
        """
        self._check_key(key)
        with self._lock:
            deadline = self._ready(timeout)
            self._send(encode({"op": "drop", "key": key}), f"drop {key!r}")
            self._await_reply(deadline, timeout, f"drop {key!r}")

    def close(self) -> None:
        """Close this end; what the anchor holds stays held. Wakes a request blocked in
        another thread (it fails with ``FdStoreError``)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with self._lock:
            self._sock.close()

    def __enter__(self) -> FdStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _receive_held(self, held: dict[str, int], deadline: float, timeout: float) -> None:
        while True:
            message, fds = self._receive(deadline, timeout, "the held descriptors")
            op, key = message.get("op"), message.get("key")
            if op == "end":
                _close_all(fds)
                return
            if op == "held" and isinstance(key, str) and len(fds) == 1:
                if key in held:
                    os.close(held[key])
                held[key] = fds.pop()
            _close_all(fds)

    def _ready(self, timeout: float) -> float:
        """The deadline of a request, once the replies a timeout left unread are read."""
        self._check_open()
        if not self._taken:
            raise FdStoreError("call take_all() first: the anchor's held descriptors come first")
        deadline = time.monotonic() + timeout
        while self._unanswered:
            _close_all(self._receive(deadline, timeout, "an earlier request's reply")[1])
            self._unanswered -= 1
        return deadline

    def _send(self, data: bytes, what: str) -> None:
        try:
            self._sock.send(data)
        except OSError as error:
            raise FdStoreError(f"cannot send {what} to the anchor: {error}") from None

    def _await_reply(self, deadline: float, timeout: float, what: str) -> None:
        self._unanswered += 1
        reply, fds = self._receive(deadline, timeout, what)
        self._unanswered -= 1
        _close_all(fds)
        if reply.get("ok") is not True:
            raise FdStoreError(f"the anchor refused {what}: {reply.get('error', reply)}")

    def _receive(
        self, deadline: float, timeout: float, what: str
    ) -> tuple[dict[str, object], list[int]]:
        """The anchor's next message as an object, and its descriptors (the caller's)."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise FdStoreError(f"the anchor did not answer within {timeout:g} s ({what})")
        try:
            self._sock.settimeout(remaining)
            data, fds, _ = receive_message(self._sock, 1)
        except TimeoutError:
            raise FdStoreError(f"the anchor did not answer within {timeout:g} s ({what})") from None
        except OSError as error:
            raise FdStoreError(f"the descriptor store failed ({what}): {error}") from None
        if not data and not fds:
            raise FdStoreError(f"the anchor closed the descriptor store ({what})")
        try:
            message = json.loads(data)
        except (ValueError, RecursionError):
            message = None
        if not isinstance(message, dict):
            _close_all(fds)
            raise FdStoreError(f"the anchor sent what is not a JSON object ({what}): {data!r}")
        return message, fds

    def _check_open(self) -> None:
        if self._sock.fileno() < 0:
            raise FdStoreError("the descriptor store is closed")

    @staticmethod
    def _check_key(key: str) -> None:
        problem = key_problem(key)
        if problem is not None:
            raise FdStoreError(f"the store cannot keep key {_shown(key)}: {problem}")


def _shown(key: object) -> str:
    text = repr(key)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _close_all(fds: Iterable[int]) -> None:
    for fd in list(fds):
        with contextlib.suppress(OSError):
            os.close(fd)
