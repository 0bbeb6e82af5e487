"""The client side of the host agent's control socket (docs/design.md §18.3): where the socket
of a ledger lives, and one request over it.

The CLI's hot commands will ask the agent through this module in a few milliseconds (issue 29),
so it is standard library only and imports no asyncio: ``socket``, ``json``, ``hashlib``,
``os`` -- and the package root's eager errors. One blocking request per connection: the cost
of connecting to a Unix socket is tens of microseconds, and a fresh connection per request
keeps the client free of any state to recover.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import struct
import time
from typing import Any

from procledger.adapters.state_dir import state_dir
from procledger.domain.errors import AgentError, AgentNotRunning, AgentSocketError, AgentTimeout

__all__ = [
    "MAX_REQUEST_BYTES",
    "SOCKET_NAME",
    "peer_uid",
    "request",
    "socket_dir",
    "socket_path",
]

MAX_REQUEST_BYTES = 64 * 1024
"""The longest request line, its newline included: requests are small commands, and a bound
keeps one client from making the agent buffer without limit."""
START_REQUEST_BYTES = 1024 * 1024
"""The longest ``start`` request: it carries the caller's environment, which may be large."""
MAX_REPLY_BYTES = 16 * 1024 * 1024
"""The longest reply the client reads: a reply is a record or a page, never a whole ledger."""
SOCKET_NAME = "agent.sock"
UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
SUN_PATH_MAX = 107
"""``sun_path`` is 108 bytes on Linux, its terminating NUL included."""


def _runtime_base(environ: os._Environ[str] | dict[str, str]) -> str:
    """``$XDG_RUNTIME_DIR/procledger`` (a tmpfs owned by the user, gone at logout: right for a
    socket), else the state directory's ``run/`` -- its path rule written once, in
    ``adapters.state_dir`` (``os`` and ``pathlib`` only: cheap enough for the hot path)."""
    xdg = environ.get("XDG_RUNTIME_DIR", "")
    if xdg and os.path.isabs(xdg):
        return os.path.join(xdg, "procledger")
    return os.path.join(state_dir(environ), "run")


def socket_dir(
    ledger_key: str,
    environ: os._Environ[str] | dict[str, str] | None = None,
    *,
    create: bool = True,
) -> str:
    """The ledger's socket folder, created ``0700`` where missing and checked where present.
    With ``create=False`` (a client: asking must not leave folders behind) a missing folder is
    left missing, and connecting then says the agent is not running.

    One folder per ledger, named by a short hash of its store key, so that any key gives a path
    short enough for ``sun_path``; the folder's mode is what keeps other users off the socket
    (a socket's own mode is set only after ``bind``).

    Raises:
        AgentSocketError: the folder is not a directory of ours with mode ``0700``, or the
            socket's path would not fit in ``sun_path``.
    """
    env = os.environ if environ is None else environ
    base = _runtime_base(env)
    folder = os.path.join(base, hashlib.sha256(ledger_key.encode()).hexdigest()[:16])
    if len(os.fsencode(os.path.join(folder, SOCKET_NAME))) > SUN_PATH_MAX:
        raise AgentSocketError(
            f"the agent's socket path under {base!r} is longer than {SUN_PATH_MAX} bytes "
            "(sun_path): set XDG_RUNTIME_DIR or XDG_STATE_HOME to a shorter folder"
        )
    for path in (base, folder):
        try:
            if not create:
                _check_private(path)
                continue
            os.makedirs(path, mode=0o700)
        except FileExistsError:
            pass
        except FileNotFoundError:
            return folder  # not created, and not there: nobody listens in it
        else:
            os.chmod(path, 0o700)  # makedirs's mode is masked by the umask
        _check_private(path)
    return folder


def _check_private(path: str) -> None:
    """Refuse a folder that is a symlink, not ours, or open to others: a socket in it would be
    reachable (or replaceable) by another user."""
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise AgentSocketError(f"{path!r} is not a directory: refusing to use it for the socket")
    if info.st_uid != os.geteuid():
        raise AgentSocketError(
            f"{path!r} belongs to uid {info.st_uid}, not {os.geteuid()}: refusing to use it"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode != 0o700:
        raise AgentSocketError(
            f"{path!r} has mode {mode:04o}, not 0700: refusing to use it (chmod 700 it)"
        )


def socket_path(
    ledger_key: str,
    environ: os._Environ[str] | dict[str, str] | None = None,
    *,
    create: bool = True,
) -> str:
    """``socket_dir(ledger_key) / agent.sock`` (``create`` as there)."""
    return os.path.join(socket_dir(ledger_key, environ, create=create), SOCKET_NAME)


def request(
    path: str | os.PathLike[str],
    doc: dict[str, Any],
    timeout: float = 5.0,
    *,
    max_bytes: int = MAX_REQUEST_BYTES,
) -> Any:
    """Send ``doc`` (one JSON object with an ``op``) and return the reply's ``result``.

    ``timeout`` bounds the whole exchange, connect to last byte: the CLI must answer even when
    the agent hangs.

    Raises:
        AgentNotRunning: no socket file, or nobody accepts on it (stale).
        AgentTimeout: the agent did not answer within ``timeout``.
        AgentError: the agent answered with an error reply, or with something that is not a
            reply (``.type`` says which).
        AgentSocketError: the server runs as another uid.
    """
    data = json.dumps(doc, separators=(",", ":")).encode() + b"\n"
    if len(data) > max_bytes:
        raise AgentError("RequestTooLarge", f"{len(data)} bytes, over {max_bytes}")
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(os.fspath(path))
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError) as error:
            raise AgentNotRunning(f"no agent answers on {os.fspath(path)!r}: {error}") from None
        except TimeoutError:
            raise AgentTimeout(f"connecting to {os.fspath(path)!r} timed out") from None
        _check_server(sock, path)
        try:
            sock.sendall(data)
        except TimeoutError:
            raise AgentTimeout(f"sending to {os.fspath(path)!r} timed out") from None
        except OSError:
            pass  # the agent closed first (a refusal): its error reply may still be there to read
        return _reply(_read_line(sock, deadline))


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected Unix socket, from the kernel
    (``SO_PEERCRED``, ``struct ucred``: pid, uid, gid): what it says cannot be forged."""
    _pid, uid, _gid = UCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size)
    )
    return int(uid)


def _check_server(sock: socket.socket, path: str | os.PathLike[str]) -> None:
    """Refuse a server of another uid (``SO_PEERCRED``): the folder's checks guard the socket
    file, this guards the other end -- the CLI will hand the agent its requests and trust its
    answers."""
    uid = peer_uid(sock)
    if uid != os.geteuid():
        raise AgentSocketError(
            f"the server on {os.fspath(path)!r} runs as uid {uid}, not {os.geteuid()}: refused"
        )


def _read_line(sock: socket.socket, deadline: float) -> bytes:
    """Read up to the first newline, within ``deadline``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AgentTimeout("the agent did not answer in time")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            raise AgentTimeout("the agent did not answer in time") from None
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            raise AgentError("ConnectionClosed", "the agent closed the connection without a reply")
        end = chunk.find(b"\n")
        if end >= 0:
            chunks.append(chunk[:end])
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_REPLY_BYTES:
            raise AgentError("ReplyTooLarge", f"the reply is over {MAX_REPLY_BYTES} bytes")


def _reply(line: bytes) -> Any:
    """The ``result`` of an ``ok`` reply; an error reply raised as ``AgentError``."""
    try:
        reply = json.loads(line)
    except ValueError as error:
        raise AgentError("BadReply", f"the reply is not JSON: {error}") from None
    if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
        raise AgentError("BadReply", "the reply is not a JSON object with 'ok'")
    if reply["ok"]:
        return reply.get("result")
    detail = reply.get("error")
    if not isinstance(detail, dict):
        raise AgentError("BadReply", "an error reply without an 'error' object")
    raise AgentError(str(detail.get("type", "Error")), str(detail.get("message", "")))
