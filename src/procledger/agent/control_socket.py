"""The server side of the host agent's control socket (docs/design.md §18.3): the agent
(``agent.host``) serves its orders on it.

One Unix socket per ledger and host, in a ``0700`` folder (``control_client.socket_dir``),
mode ``0600``. Each connection's peer is checked with ``SO_PEERCRED``: only the agent's own uid
is served. Requests are one JSON object per line, at most ``MAX_REQUEST_BYTES``; each gets one
JSON line back, ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": {"type", "message"}}``.
Nothing a client sends stops the server: every failure of a request is an error reply, and at
worst its connection is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import importlib.metadata
import json
import os
import socket
import stat
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from procledger.agent.control_client import MAX_REQUEST_BYTES, SOCKET_NAME, peer_uid
from procledger.domain.errors import AgentSocketError

__all__ = ["ControlServer", "Handler", "RequestError"]

Handler = Callable[[dict[str, Any]], Awaitable[Any]]
"""A request's handler: the decoded request in, a JSON-encodable result out."""


class RequestError(Exception):
    """A request refused before (or instead of) its handler: its ``type`` goes in the reply."""

    def __init__(self, type_: str, message: str) -> None:
        super().__init__(message)
        self.type = type_


def _encode(reply: dict[str, Any]) -> bytes:
    return json.dumps(reply, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def _error(type_: str, message: str) -> bytes:
    return _encode({"ok": False, "error": {"type": type_, "message": message[:1000]}})


def _decode(line: bytes) -> dict[str, Any]:
    """One request line to its object, or ``RequestError`` saying why not."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError("BadUtf8", str(error)) from None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise RequestError("BadJson", str(error) or type(error).__name__) from None
    if not isinstance(doc, dict):
        raise RequestError("NotAnObject", f"a request is a JSON object, not {type(doc).__name__}")
    return doc


class ControlServer:
    """The agent's control socket: ``async with ControlServer(folder) as server: ...``.

    ``handlers`` maps each ``op`` to its coroutine; ``ping`` is built in. ``max_connections``
    bounds the connections served at once (one more is answered ``Busy`` and closed), and
    ``read_timeout`` bounds the wait for each request line, and for each reply to be taken, so
    a client that stalls mid-line, idles, or never reads gives its slot back. A handler is
    not bounded here: one that hangs holds its connection's slot until it returns, so
    handlers bound their own waits.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        handlers: Mapping[str, Handler] | None = None,
        *,
        max_connections: int = 64,
        read_timeout: float = 10.0,
        max_request_bytes: int = MAX_REQUEST_BYTES,
    ) -> None:
        self.path = os.path.join(os.fspath(folder), SOCKET_NAME)
        self._lock_path = os.path.join(os.fspath(folder), "agent.lock")
        self._handlers: dict[str, Handler] = {"ping": self._ping, **(handlers or {})}
        self._max_connections = max_connections
        self._read_timeout = read_timeout
        self._max_request = max_request_bytes
        self._active = 0
        self._serving: set[asyncio.Task[Any]] = set()  # connections being served now
        self._started = time.monotonic()
        self._server: asyncio.Server | None = None
        self._lock_fd: int | None = None
        # The distribution's version (a test keeps ``procledger.__version__`` equal to it):
        # importing the package root here would make this module depend, for the layers
        # contract, on every package the root re-exports.
        self._version = importlib.metadata.version("procledger")

    async def __aenter__(self) -> ControlServer:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Take the folder's lock, replace a stale socket file, bind and listen.

        Raises:
            AgentSocketError: another agent holds the lock or answers on the socket, or the
                path holds something other than a socket.
        """
        self._lock_fd = _take_lock(self._lock_path)
        try:
            _clear_stale(self.path)
            self._server = await asyncio.start_unix_server(
                self._serve, path=self.path, limit=self._max_request + 1
            )
            os.chmod(self.path, 0o600)  # bind made it by the umask; the 0700 folder guards the gap
        except BaseException:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise
        self._started = time.monotonic()

    async def close(self) -> None:
        """Stop listening, remove the socket file, release the lock; connections still being
        served (a handler that hangs) are cancelled and closed, not left to the garbage
        collector with their transports open."""
        if self._server is not None:
            self._server.close()
            self._server = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        serving = [task for task in self._serving if task is not asyncio.current_task()]
        for task in serving:
            task.cancel()
        await asyncio.gather(*serving, return_exceptions=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    async def _ping(self, _request: dict[str, Any]) -> dict[str, Any]:
        """Who answers: the agent's pid, seconds since it started listening, its version."""
        return {
            "pid": os.getpid(),
            "uptime_s": round(time.monotonic() - self._started, 3),
            "version": self._version,
        }

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: refuse it when full or foreign, else answer its lines in turn."""
        if self._active >= self._max_connections:
            await _send_and_close(writer, _error("Busy", "too many connections; retry"))
            return
        self._active += 1
        task = asyncio.current_task()
        if task is not None:
            self._serving.add(task)
        try:
            refusal = _peer_refusal(writer)
            if refusal is not None:
                await _send_and_close(writer, refusal)
                return
            while await self._answer_one(reader, writer):
                pass
        except (ConnectionError, OSError):
            pass  # the client went away mid-reply: nothing to tell it
        finally:
            self._active -= 1
            if task is not None:
                self._serving.discard(task)
            writer.close()

    async def _answer_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read one line and answer it; ``False`` when the connection is done."""
        try:
            line = await asyncio.wait_for(reader.readuntil(b"\n"), self._read_timeout)
        except asyncio.IncompleteReadError:
            return False  # end of stream (mid-line or not): nobody to answer
        except asyncio.LimitOverrunError:
            await _send_and_close(
                writer,
                _error("RequestTooLarge", f"a request line is at most {self._max_request} bytes"),
            )
            return False
        except TimeoutError:
            await _send_and_close(
                writer, _error("Timeout", f"no complete request within {self._read_timeout} s")
            )
            return False
        if len(line) > self._max_request:  # the stream's limit lets a line two bytes longer by
            await _send_and_close(
                writer, _error("RequestTooLarge", f"over {self._max_request} bytes")
            )
            return False
        writer.write(await self._reply(line))
        # A client that sends but never reads would block this drain for good: bounded like a
        # read (its TimeoutError is an OSError, which ends the connection in ``_serve``).
        await asyncio.wait_for(writer.drain(), self._read_timeout)
        return True

    async def _reply(self, line: bytes) -> bytes:
        """The reply line to one request line; never raises."""
        try:
            request = _decode(line)
            op = request.get("op")
            handler = self._handlers.get(op) if isinstance(op, str) else None
            if handler is None:
                raise RequestError(
                    "UnknownOp", f"unknown op {op!r}; known: {sorted(self._handlers)}"
                )
            return _encode({"ok": True, "result": await handler(request)})
        except RequestError as error:
            return _error(error.type, str(error))
        except Exception as error:  # a handler's failure is its request's, not the server's
            return _error(type(error).__name__, str(error))


def _peer_refusal(writer: asyncio.StreamWriter) -> bytes | None:
    """The error reply for a peer of another uid (``SO_PEERCRED``), or ``None`` to serve it."""
    sock: socket.socket = writer.get_extra_info("socket")
    uid = peer_uid(sock)
    if uid != os.geteuid():
        return _error("PermissionDenied", f"uid {uid} may not use this agent")
    return None


async def _send_and_close(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Best effort: the peer may already be gone, and that is not the server's failure."""
    with contextlib.suppress(ConnectionError, OSError):
        writer.write(data)
        await asyncio.wait_for(writer.drain(), 1.0)
    writer.close()


def _take_lock(path: str) -> int:
    """The folder's ``flock``: one agent per ledger and host, even when two start at once and
    both find a stale socket file (the connect check alone would let both bind)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AgentSocketError(
            f"another agent holds {path!r}: one agent per ledger and host"
        ) from None
    return fd


def _clear_stale(path: str) -> None:
    """Remove a socket file nobody answers on; refuse one somebody does, or a non-socket."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise AgentSocketError(f"{path!r} exists and is not a socket: refusing to replace it")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(path)  # stale: its agent died without removing it
            return
        except OSError:
            pass  # a backlog full or slow to accept is somebody alive
    raise AgentSocketError(f"another agent answers on {path!r}: one agent per ledger and host")
