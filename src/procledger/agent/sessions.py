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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from procledger.adapters.input_waits import InputSource, InputWaitWatch, Waiting
from procledger.domain.errors import InputRefused
from procledger.domain.input import InputWait
from procledger.supervisor.input import InputTarget, PipeInput, deliver
from procledger.supervisor.terminal import Appender, Terminal, TerminalSize

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = ["PTY_KEY", "STDIN_KEY", "DescriptorStore", "Session", "Sessions"]

log = logging.getLogger("procledger.agent")

PTY_KEY: Final = "{}/pty"
STDIN_KEY: Final = "{}/stdin"
RELAY_CHUNK: Final = 65_536
WATCH_S: Final = 0.2
"""How often each session is looked at: a wait settles in two looks, so it is told within
about half a second (the issue's bound: 1 s)."""
LAST_LINE_BYTES: Final = 4096


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
    appender: Appender | None = None  # the output file, opened for a relay
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    watch: InputWaitWatch | None = None
    seen: int = 0  # how much of the output file the watch has seen
    waiting: bool = False  # a wait is on record

    @property
    def terminal(self) -> Terminal | None:
        return self.target if isinstance(self.target, Terminal) else None


class Sessions:
    """The sessions by process id, each descriptor kept in the anchor's store as well."""

    def __init__(
        self,
        registry: ProcessRegistry,
        store: DescriptorStore | None,
        told: Callable[[str, Waiting], None] | None = None,
    ) -> None:
        """``told``: called (in a worker thread) once a wait is on record, to notify."""
        self._registry, self._store, self._told = registry, store, told
        self._by_id: dict[str, Session] = {}

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
        self._watch(session)

    def adopt(self, process_id: str, pid: int, fds: dict[str, int], output: Path | None) -> None:
        """A run an earlier agent spawned and this one holds: take its descriptors back from
        what the store handed over (``fds``, emptied of them) and relay its terminal."""
        pty_fd = fds.pop(PTY_KEY.format(process_id), None)
        stdin_fd = fds.pop(STDIN_KEY.format(process_id), None)
        target: InputTarget
        if pty_fd is not None:
            os.set_blocking(pty_fd, False)
            target, key = Terminal(pty_fd), PTY_KEY.format(process_id)
        elif stdin_fd is not None:
            target, key = PipeInput(stdin_fd), STDIN_KEY.format(process_id)
        else:
            return
        session = Session(process_id, target, pid, key, output, owned=False)
        self._by_id[process_id] = session
        self._relay(session)  # a terminal's output; nothing for a pipe
        self._watch(session)

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
        if session.watch is not None:
            session.watch.note_input()
            session.waiting = False  # the input_sent fact ended the wait on record
        if options.get("eof") and not isinstance(session.target, Terminal):
            self._drop(session.key)  # the anchor's copy too: only then does the reader see EOF
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

    # -- knowing when one waits for input (docs/design.md §20.3) ---------------------------

    def _watch(self, session: Session) -> None:
        target = session.target
        source = (
            InputSource.of_terminal(target.fileno())
            if isinstance(target, Terminal)
            else InputSource.of_pipe(target.fileno())
        )
        session.watch = InputWaitWatch(source, session.pid)  # its first look reads the tail

    async def watch_waits(self) -> None:
        """Look at every session every ``WATCH_S``: a wait that settled is recorded (and
        notified), one that ended without a send recorded as ended."""
        while True:
            await asyncio.sleep(WATCH_S)
            now = time.monotonic()
            for session in list(self._by_id.values()):
                change = self._look(session, now)
                if change is not None:
                    await asyncio.to_thread(self._record, session.process_id, change)

    def _look(self, session: Session, now: float) -> Waiting | bool | None:
        """What to record of ``session`` now: a ``Waiting``, ``False`` (its wait is over) or
        nothing."""
        watch = session.watch
        if watch is None:
            return None
        self._note_output(session, watch)
        found = watch.check(now)
        if found is not None:
            session.waiting = True
            return found
        if session.waiting and not watch.fired:
            session.waiting = False
            return False
        return None

    def _note_output(self, session: Session, watch: InputWaitWatch) -> None:
        """What the run wrote since the last look (its tail is enough for the last line)."""
        if session.output is None:
            return
        try:
            size = session.output.stat().st_size
            if size == session.seen:
                return
            start = max(session.seen, size - LAST_LINE_BYTES)
            if size < session.seen:  # the bound cut the file's front: read its end
                start = max(0, size - LAST_LINE_BYTES)
            with open(session.output, "rb") as file:
                file.seek(start)
                data = file.read(size - start)
        except OSError:
            return
        session.seen = size
        watch.note_output(data)

    def _record(self, process_id: str, change: Waiting | bool) -> None:
        try:
            if isinstance(change, Waiting):
                wait = InputWait(change.kind, change.last_line, change.pid, change.how)
                self._registry.record_waiting(process_id, wait)
                if self._told is not None:
                    self._told(process_id, change)
            else:
                self._registry.record_wait_ended(process_id)
        except Exception as error:  # it ended meanwhile, or the store is down: next time
            log.info("process %s: waiting for input not recorded: %s", process_id, error)

    # -- relaying a held terminal -----------------------------------------------------------

    def _relay(self, session: Session) -> None:
        terminal, output = session.terminal, session.output
        if terminal is None:
            return
        if output is not None:
            try:
                fd = os.open(output, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
                session.appender = Appender(fd)
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
        if session.appender is not None:
            try:
                session.appender(chunk)
            except OSError as error:  # a full disk: the output is lost, the child goes on
                log.warning("process %s: output not kept: %s", session.process_id, error)

    def _stop_relay(self, session: Session) -> None:
        terminal = session.terminal
        if not session.owned and terminal is not None and not terminal.closed:
            with contextlib.suppress(RuntimeError, ValueError):
                asyncio.get_running_loop().remove_reader(terminal.fileno())
        if session.appender is not None:
            with contextlib.suppress(OSError):
                os.close(session.appender.fd)
            session.appender = None

    def _drop(self, key: str) -> None:
        if self._store is None:
            return
        try:
            self._store.drop(key)
        except Exception as error:
            log.warning("the anchor did not let %s go: %s", key, error)
