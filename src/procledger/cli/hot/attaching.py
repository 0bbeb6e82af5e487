"""`attach`: this terminal joined to a background process's pseudo-terminal (docs/design.md
§20.2), as ``tmux attach`` or ``docker attach`` do, and left again with a key sequence while
the process runs on.

Output is followed in the run's output file -- where the agent relays the terminal's output
whether anyone is attached or not -- so attaching changes nothing for the process, and several
attach at once. Keystrokes and the window size go to the agent, which holds the terminal; they
are not journalled (typing is not a command: ``send`` is). A full-screen program redraws on
the window size the attach sends first, as it does when tmux attaches.
"""

from __future__ import annotations

import base64
import contextlib
import os
import select
import signal
import sys
import time
from argparse import Namespace
from typing import Any, Final

from procledger.adapters import output_reading as reading
from procledger.adapters.output_files import OutputReader
from procledger.cli.hot import marks as marking
from procledger.cli.hot.opening import reading as ledger
from procledger.cli.hot.sending import agent_for, live_target
from procledger.cli.terminal_relay import RawMode, window_size
from procledger.cli.values import UsageError
from procledger.domain.errors import InputRefused

__all__ = ["DetachKeys", "attach"]

SCREEN_BYTES: Final = 8192
"""How much of the output so far is shown on attaching: about a screenful."""
POLL_S: Final = 0.02
ENDED_CHECK_S: Final = 0.2
_NAMED = {"ctrl-@": 0, "ctrl-[": 27, "ctrl-\\": 28, "ctrl-]": 29, "ctrl-^": 30, "ctrl-_": 31}


class DetachKeys:
    """Spots the detach sequence in what is typed; what only began like it is passed on."""

    def __init__(self, spec: str) -> None:
        self.sequence = _parse_keys(spec)
        self._held = b""

    def feed(self, data: bytes) -> tuple[bytes, bool]:
        """What to pass on, and whether the sequence is complete (the rest is dropped)."""
        out = bytearray()
        for byte in data:
            candidate = self._held + bytes([byte])
            if self.sequence.startswith(candidate):
                self._held = candidate
                if candidate == self.sequence:
                    self._held = b""
                    return bytes(out), True
                continue
            out += self._held + bytes([byte])
            self._held = b""
        return bytes(out), False


def _parse_keys(spec: str) -> bytes:
    keys = bytearray()
    for word in (part.strip().lower() for part in spec.split(",")):
        if word in _NAMED:
            keys.append(_NAMED[word])
        elif word.startswith("ctrl-") and len(word) == 6 and "a" <= word[5] <= "z":
            keys.append(ord(word[5]) - ord("a") + 1)
        elif len(word) == 1 and word.isascii():
            keys.append(ord(word))
        else:
            raise UsageError(
                f"{word!r} is not a key: a letter, ctrl-<letter> or ctrl-[\\]^_@", "--detach-keys"
            )
    return bytes(keys)


def attach(options: Namespace, url: str | None, *, fast: bool) -> int:
    keys = DetachKeys(options.detach_keys)
    if not (os.isatty(0) and os.isatty(1)):
        raise UsageError("attach needs a terminal; without one use send and logs -f", "ID")
    process_id = live_target(url, options.process_id, fast=fast)
    with ledger(url, fast=fast) as reads:
        record = reads.record(process_id)
        if not record.get("pty"):
            raise InputRefused(
                f"process {process_id} has no terminal (started without --pty): "
                "send writes to its stdin, logs -f shows its output"
            )
        reader = reading.reader_for(
            record, store_key=reads.store_key, host_id=marking.host_id_or_none(), tail=dict
        )
        session = _Attached(url, process_id, reader, keys)
        ended = session.run(lambda: marking.is_terminal(reads.record(process_id)))
        final = reads.record(process_id) if ended else None
    _say(f"[detached from {process_id}]" if final is None else _how_it_ended(final))
    return 0


class _Attached:
    """One attach: the relay loop between this terminal, the agent and the output file."""

    def __init__(self, url: str | None, process_id: str, reader: OutputReader, keys: DetachKeys):
        self._url, self._id, self._reader, self._keys = url, process_id, reader, keys
        self._positions = [0, 0]
        self._resized = True  # the first order says the window's size

    def run(self, ended: Any) -> bool:
        """Relay until detached (``False``) or the process ended (``True``)."""
        self._show_screen()
        previous = signal.signal(signal.SIGWINCH, self._on_resize)
        try:
            raw = RawMode(0)
            raw.enter()
            try:
                return self._loop(ended)
            finally:
                raw.leave()
        finally:
            signal.signal(signal.SIGWINCH, previous)

    def _loop(self, ended: Any) -> bool:
        checked, done = 0.0, False
        while True:
            if self._resized:
                self._tell(b"")
            ready, _, _ = select.select([0], [], [], POLL_S)
            if ready:
                typed = os.read(0, 4096)
                passed, detach = self._keys.feed(typed)
                if passed:
                    self._tell(passed)
                if detach or not typed:
                    return False
            came = self._copy_output()
            if done and not came:
                return True
            now = time.monotonic()
            if now - checked >= ENDED_CHECK_S:
                done, checked = ended(), now

    def _tell(self, data: bytes) -> None:
        order: dict[str, Any] = {"op": "keys", "process_id": self._id}
        order["data"] = base64.b64encode(data).decode("ascii")
        if self._resized:
            self._resized = False
            size = window_size((1, 0))
            order["size"] = [size.rows, size.cols]
        with contextlib.suppress(InputRefused):  # it ended: the loop sees that next
            agent_for(self._url, self._id, order)

    def _show_screen(self) -> None:
        """The output so far, its last ``SCREEN_BYTES``: a line-based program's context."""
        tail = b""
        for chunk in reading.chunks(self._reader, "stdout", self._positions):
            tail = (tail + chunk.data)[-SCREEN_BYTES:]
        _write(tail)

    def _copy_output(self) -> bool:
        came = False
        for chunk in reading.chunks(self._reader, "stdout", self._positions):
            _write(chunk.data)
            came = True
        return came

    def _on_resize(self, signum: int, frame: Any) -> None:
        self._resized = True


def _write(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


def _how_it_ended(record: dict[str, Any]) -> str:
    code = record.get("exit_code")
    how = f"exit {code}" if code is not None else f"signal {record.get('signal')}"
    return f"[process {record['id']} ended: {record['state']} ({how})]"


def _say(line: str) -> None:
    sys.stdout.write("\r\n" + line + "\r\n")
    sys.stdout.flush()
