"""Input to a running child (docs/design.md §20.2): each send journalled, then written.

A send is a command: its ``input_sent`` fact is committed under the sender's command id
*before* the bytes are written, so a send retried with the same id (its answer was lost, the
sender crashed) finds the fact and writes nothing more -- applied once. The one window left:
a host that dies between the commit and the write leaves a send on record that was never
written; the sender's retry is then refused as done. Writing first would instead leave a
written send unrecorded and write it again on retry, which a terminal cannot take back.

Bytes are kept in the fact unless the terminal hides what is typed when they are sent (echo
off in line mode: a program reading a password) or the sender asks: then only their size and
digest are.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
import uuid
from typing import TYPE_CHECKING, Final, Protocol

from procledger.domain.errors import InputRefused, StdinError
from procledger.domain.input import SentInput

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = ["WRITE_TIMEOUT_S", "InputTarget", "PipeInput", "deliver", "new_command_id"]

WRITE_TIMEOUT_S: Final = 10.0
"""How long a send waits for a child that does not read (its input queue full)."""


class InputTarget(Protocol):
    """Where a child reads: its terminal's master (``terminal.Terminal``) or the write end of
    its stdin pipe (``PipeInput``)."""

    def fileno(self) -> int: ...

    def hides_input(self) -> bool: ...

    def end_of_input(self) -> bytes: ...

    def close(self) -> None: ...


class PipeInput:
    """The write end of a child's stdin pipe: no echo to tell a secret by, and end of input
    is closing it."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def hides_input(self) -> bool:
        return False

    def end_of_input(self) -> bytes:
        return b""

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


def new_command_id() -> str:
    return f"send-{uuid.uuid4().hex}"


def deliver(
    registry: ProcessRegistry,
    process_id: str,
    target: InputTarget | None,
    data: bytes,
    *,
    command_id: str | None = None,
    eof: bool = False,
    redact: bool = False,
) -> bool:
    """Journal ``data`` as ``command_id``'s send, then write it (and end the input after it,
    ``eof``); ``False`` -- nothing written -- when that command id is on record already.

    Raises:
        InputRefused: no target (started without a terminal or input pipe), or it is closed.
        StdinError: the child's side closed before the bytes were all written.
        ReplayConflict, InvalidTransition: as ``ProcessRegistry.record_input``.
    """
    if target is None or target.fileno() < 0:
        raise InputRefused(
            f"process {process_id!r} takes no input: it runs without a terminal or an input "
            "pipe (start it with pty=True, or run --pty / --stdin pipe)"
        )
    redacted = redact or target.hides_input()
    sent = SentInput(command_id or new_command_id(), data, redacted=redacted, eof=eof)
    _, applied = registry.record_input(process_id, sent)
    if applied:
        write_input(process_id, target, data, eof=eof)
    return applied


def write_input(process_id: str, target: InputTarget, data: bytes, *, eof: bool) -> None:
    """Write all of ``data`` to a non-blocking target, waiting while it is full."""
    end = target.end_of_input() if eof else b""
    view, deadline = memoryview(data + end), time.monotonic() + WRITE_TIMEOUT_S
    writable = select.poll()  # not select(): an agent holds descriptors past FD_SETSIZE
    writable.register(target.fileno(), select.POLLOUT)
    try:
        while view:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not writable.poll(remaining * 1000):
                raise StdinError(
                    f"process {process_id!r} did not read its input: {len(view)} of "
                    f"{len(data)} bytes unwritten after {WRITE_TIMEOUT_S:g} s"
                )
            with contextlib.suppress(BlockingIOError):
                view = view[os.write(target.fileno(), view) :]
    except OSError as exc:  # EIO: the terminal hung up; EPIPE: the pipe's reader is gone
        raise StdinError(
            f"process {process_id!r} closed its input with {len(view)} bytes unwritten"
        ) from exc
    if eof and not end:
        target.close()
