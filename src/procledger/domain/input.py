"""What input a process was sent and when it waits for more (docs/design.md §20): the values
the ``InputSent`` and ``WaitingForInput`` facts are made of, checked once here so that the
aggregate only journals them."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from procledger.domain.errors import ProcessLifecycleValidationError

__all__ = ["MAX_INPUT_BYTES", "InputWait", "SentInput", "WaitKind"]

MAX_INPUT_BYTES: Final = 64 * 1024
"""The most one send may carry: a terminal's input queue holds 4 KiB a line and a pipe 64 KiB;
larger input belongs in a file the command reads (``send --file`` streams are not kept)."""
MAX_COMMAND_ID: Final = 200
MAX_LAST_LINE: Final = 200


class WaitKind(StrEnum):
    """What the process seems to wait for; ``input`` when it reads and nothing tells more."""

    password = "password"
    question = "question"
    prompt = "prompt"
    input = "input"


@dataclass(frozen=True, slots=True)
class SentInput:
    """One send: its command id, the bytes, whether they are kept (``redacted``: not) and
    whether the input is closed after them."""

    command_id: str
    data: bytes
    redacted: bool = False
    eof: bool = False

    def __post_init__(self) -> None:
        if not (0 < len(self.command_id) <= MAX_COMMAND_ID) or not self.command_id.isprintable():
            raise ProcessLifecycleValidationError(
                "command_id",
                f"a command id is 1 to {MAX_COMMAND_ID} printable characters, "
                f"not {self.command_id!r}",
            )
        if len(self.data) > MAX_INPUT_BYTES:
            raise ProcessLifecycleValidationError(
                "data", f"one send carries at most {MAX_INPUT_BYTES} bytes, not {len(self.data)}"
            )
        if not self.data and not self.eof:
            raise ProcessLifecycleValidationError("data", "nothing to send: no bytes and no EOF")

    @property
    def digest(self) -> str:
        """What a retry must match: the bytes and the EOF, hashed (kept even when redacted)."""
        body = hashlib.sha256(self.data + (b"\x04" if self.eof else b"")).hexdigest()
        return f"sha256:{body}"

    def fields(self) -> dict[str, Any]:
        return {
            "command_id": self.command_id,
            "size": len(self.data),
            "digest": self.digest,
            "data": None if self.redacted else base64.b64encode(self.data).decode("ascii"),
            "redacted": self.redacted,
            "eof": self.eof,
        }


@dataclass(frozen=True, slots=True)
class InputWait:
    """A process seen blocked reading its input: the kind, its last line, who and how."""

    kind: WaitKind
    last_line: str
    pid: int
    how: str

    def fields(self) -> dict[str, Any]:
        return {
            "kind": WaitKind(self.kind).value,
            "last_line": self.last_line[-MAX_LAST_LINE:],
            "pid": self.pid,
            "how": self.how,
        }
