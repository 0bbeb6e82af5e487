"""The agent's interactive sessions (docs/design.md §20.2): the runs whose input it holds -- a
pseudo-terminal's master, or the write end of a stdin pipe -- so that ``send``, ``attach`` and
the waiting-for-input watch reach them.

Each such descriptor is also kept by the anchor (its descriptor store, §18.9): when the agent
dies, the terminal is not hung up and the pipe not closed, so the child neither gets SIGHUP
nor reads an end of input it was never sent. The next agent takes them back, and for a
terminal it relays the output again -- what the child wrote meanwhile waited in the kernel's
buffer (and, once that was full, the child waited in its write).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from procledger.domain.errors import InputRefused
from procledger.supervisor.input import InputTarget, PipeInput, deliver
from procledger.supervisor.terminal import Terminal, TerminalSize

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = ["PTY_KEY", "STDIN_KEY", "DescriptorStore", "Session", "Sessions"]

log = logging.getLogger("procledger.agent")

PTY_KEY: Final = "{}/pty"
STDIN_KEY: Final = "{}/stdin"
RELAY_CHUNK: Final = 65_536


class DescriptorStore(Protocol):
    """The anchor's descriptor store, as the agent uses it (``agent.fd_store.FdStore``)."""

    def keep(self, key: str, fd: int, timeout: float = ...) -> None: ...

    def drop(self, key: str, timeout: float = ...) -> None: ...


@dataclass(eq=False)
class Session:
    """One run whose input this agent holds. ``owned``: the target belongs to the run's
    ``OwnedChild`` (a run this agent spawned), which relays and closes it; otherwise (a run
    an earlier agent spawned) this agent relays a terminal's output to ``output`` itself."""

    process_id: str
    target: InputTarget
    pid: int
    key: str
    output: Path | None = None
    owned: bool = True
    appender: int = -1  # the output file, opened for a relay
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def terminal(self) -> Terminal | None:
        return self.target if isinstance(self.target, Terminal) else None


class Sessions:
    """The sessions by process id, each descriptor kept in the anchor's store as well."""

    def __init__(self, registry: ProcessRegistry, store: DescriptorStore | None) -> None:
        self._registry, self._store = registry, store
        self._by_id: dict[str, Session] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        return len(self._by_id)

    def all(self) -> list[Session]:
        return list(self._by_id.values())

    def get(self, process_id: str) -> Session:
        session = self._by_id.get(process_id)
        if session is None:
            raise InputRefused(
                f"process {process_id!r} takes no input here: it was started without a "
                "terminal or an input pipe (run --background --pty, or --stdin pipe), it "
                "ended, or this host's agent does not hold it"
            )
        return session

    def add(self, session: Session) -> None:
        """Hold a session; its descriptor is given to the store first (a failure there is
        logged: the session then lives only as long as this agent)."""
        if self._store is not None:
            try:
                self._store.keep(session.key, session.target.fileno())
            except Exception as error:
                log.warning("process %s: its input is not kept by the anchor: %s",
                            session.process_id, error)  # fmt: skip
        self._by_id[session.process_id] = session

    def adopt(self, process_id: str, pid: int, fds: dict[str, int], output: Path | None) -> None:
        """A run an earlier agent spawned and this one holds: take its descriptors back from
        what the store handed over (``fds``, emptied of them) and relay its terminal."""
        pty_fd = fds.pop(PTY_KEY.format(process_id), None)
        stdin_fd = fds.pop(STDIN_KEY.format(process_id), None)
        if pty_fd is not None:
            os.set_blocking(pty_fd, False)
            session = Session(process_id, Terminal(pty_fd), pid, PTY_KEY.format(process_id))
            session.owned, session.output = False, output
            self._by_id[process_id] = session
            self._relay(session)
        elif stdin_fd is not None:
            key = STDIN_KEY.format(process_id)
            self._by_id[process_id] = Session(
                process_id, PipeInput(stdin_fd), pid, key, owned=False
            )

    def forget_unheld(self, fds: dict[str, int]) -> None:
        """Descriptors of runs that ended while no agent ran: closed and dropped."""
        for key, fd in fds.items():
            with contextlib.suppress(OSError):
                os.close(fd)
            self._drop(key)

    def end(self, process_id: str) -> None:
        """The run ended: its descriptor is let go, here and in the store."""
        session = self._by_id.pop(process_id, None)
        if session is None:
            return
        self._stop_relay(session)
        if not session.owned:
            session.target.close()
        self._drop(session.key)

    # -- orders --------------------------------------------------------------------------

    async def send(self, process_id: str, data: bytes, **options: Any) -> bool:
        """A journalled send (``supervisor.input.deliver``), one at a time per session (so
        that a retry racing its original finds it on record), in a worker thread."""
        session = self.get(process_id)
        async with session.lock:
            applied: bool = await asyncio.to_thread(
                deliver, self._registry, process_id, session.target, data, **options
            )
        return applied

    def keys(self, process_id: str, data: bytes, size: TerminalSize | None) -> int:
        """Keystrokes from ``attach``: written now, as far as the terminal takes them."""
        session = self.get(process_id)
        terminal = session.terminal
        if size is not None and terminal is not None:
            with contextlib.suppress(OSError):
                terminal.resize(size)
        if not data:
            return 0
        try:
            return os.write(session.target.fileno(), data)
        except BlockingIOError:
            return 0
        except OSError as error:
            raise InputRefused(f"process {process_id!r}: its input is closed ({error})") from None

    # -- relaying a held terminal -----------------------------------------------------------

    def _relay(self, session: Session) -> None:
        terminal, output = session.terminal, session.output
        if terminal is None:
            return
        if output is not None:
            try:
                session.appender = os.open(output, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            except OSError as error:
                log.warning("process %s: its output file: %s", session.process_id, error)
        loop = asyncio.get_running_loop()
        loop.add_reader(terminal.fileno(), self._relay_once, session)

    def _relay_once(self, session: Session) -> None:
        terminal = session.terminal
        assert terminal is not None
        chunk = terminal.read(RELAY_CHUNK)
        if chunk is None:
            return
        if not chunk:  # every holder of the child's side closed it
            self._stop_relay(session)
            return
        if session.appender >= 0:
            try:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(session.appender, view) :]
            except OSError as error:  # a full disk: the output is lost, the child goes on
                log.warning("process %s: output not kept: %s", session.process_id, error)

    def _stop_relay(self, session: Session) -> None:
        terminal = session.terminal
        if not session.owned and terminal is not None and not terminal.closed:
            with contextlib.suppress(RuntimeError, ValueError):
                asyncio.get_running_loop().remove_reader(terminal.fileno())
        if session.appender >= 0:
            with contextlib.suppress(OSError):
                os.close(session.appender)
            session.appender = -1

    def _drop(self, key: str) -> None:
        if self._store is None:
            return
        try:
            self._store.drop(key)
        except Exception as error:
            log.warning("the anchor did not let %s go: %s", key, error)
