"""The Supervisor driven from an event loop (docs/design.md §17).

``AsyncSupervisor`` wraps one ``Supervisor``: every write it makes, and when, is the
Supervisor's own (§6.2) -- ``start``, ``stop`` and the terminal path run in a small bounded
pool of worker threads (anyio's ``to_thread`` with a ``CapacityLimiter``). What changes is who
waits for each child: the Supervisor's ``watch`` seam hands the child to this event loop,
which waits for its descriptors (a pidfd on Linux, a kqueue on macOS, and its pipes) with
``anyio.wait_readable`` -- no thread per child -- steps it with ``OwnedChild.advance`` and,
once it has completed, runs the Supervisor's one completion path (outbox first, then the
terminal write that releases the lease, then the notification) in a worker thread.

Cancellation never reaches a child: a task awaiting ``wait()`` or iterating ``output()``
only stops awaiting. Leaving ``async with`` stops the children still running
(``on_exit="stop"``: the Supervisor's shutdown, each tree stopped from the loop with
``OwnedChild.stop_steps`` and each recorded ``runner_shutdown``) or leaves them running,
watched by owner threads as with the plain Supervisor (``"leave"``).
"""

from __future__ import annotations

import functools
import math
import signal
import threading
from collections.abc import AsyncGenerator, Callable, Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal, final

import anyio
from anyio import CapacityLimiter, to_thread
from anyio.abc import TaskGroup

from procledger.adapters.output_files import Chunk
from procledger.aio.batches import Batches
from procledger.aio.output import output_chunks
from procledger.domain.errors import InputRefused, SupervisorClosed
from procledger.domain.leases import LeaseOwner
from procledger.domain.records import ProcessRecord
from procledger.supervisor.execution import POLL_S, OwnedChild, StopPolicy
from procledger.supervisor.file_capture import FileCapture
from procledger.supervisor.modes import StopMode
from procledger.supervisor.os_seam import Usage
from procledger.supervisor.supervisor import ProcessHandle, Settle, Supervisor
from procledger.supervisor.terminal import TerminalSize

_Started = tuple[ProcessHandle, "_Watched | None"]

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = ["AsyncProcessHandle", "AsyncSupervisor", "OnExit"]

OnExit = Literal["stop", "leave"]


BATCH_MOST = 32
"""Starts (or terminals) one worker-thread call makes at most: a burst of starts is spawned
in batches of this many, the first returning after its batch's writes."""

READY_POLL_FIRST_S = 0.005
READY_POLL_MAX_S = 0.1
"""How often ``wait_ready`` asks again: soon at first (a probe often holds at once), then at
most ten times a second."""


@dataclass(slots=True)
class _Watched:
    """A child the loop waits for, and what the loop knows of it."""

    child: OwnedChild
    settle: Settle
    handle: ProcessHandle | None = None
    done: anyio.Event = field(default_factory=anyio.Event)
    left: bool = False  # handed to an owner thread (``on_exit="leave"``)
    record: ProcessRecord | None = None  # the terminal, as ``settle`` left it (if it did)
    exited: anyio.Event = field(default_factory=anyio.Event)  # seen to exit, or no more watched


@final
class AsyncProcessHandle:
    """One process started by an ``AsyncSupervisor``: ``handle`` and ``process_id`` as
    ``ProcessHandle``'s, and the awaitable operations on it."""

    def __init__(self, supervisor: AsyncSupervisor, handle: ProcessHandle) -> None:
        self._supervisor = supervisor
        self.handle = handle.handle
        self.process_id = handle.process_id
        self.sync = handle

    def __repr__(self) -> str:
        return f"AsyncProcessHandle(handle={self.handle!r}, process_id={self.process_id!r})"

    async def wait(self) -> ProcessRecord:
        """The record once the process's one terminal is recorded. Cancelling the waiter --
        or a timeout around it (``anyio.fail_after``) -- leaves the child running, recorded
        ``running``, still supervised.

        Raises:
            StoreError: the terminal could not be written.
        """
        return await self._supervisor.wait(self)

    async def stop(self, mode: StopMode | str, grace_s: float | None = None) -> ProcessRecord:
        """Stop the tree as ``Supervisor.stop`` does (the request recorded first); returns the
        record once it ended (``interrupt``: once the grace passed). Once begun, a stop runs
        to its end even if the awaiting task is cancelled.

        Raises:
            ValueError: ``mode`` is not a stop mode.
        """
        return await self._supervisor.stop(self, mode, grace_s)

    async def wait_ready(self, timeout: float | None = None) -> ProcessRecord:
        """The record once the process is ready (its probes held: ``ready_at_ms`` set) or has
        ended without becoming ready (its terminal record), as ``Supervisor.wait_ready``
        (docs/design.md §15.3); a process started without probes is ready once it runs.
        Cancelling the waiter leaves the child running.

        Raises:
            TimeoutError: neither happened within ``timeout`` seconds.
        """
        return await self._supervisor.wait_ready(self, timeout)

    async def record(self) -> ProcessRecord:
        """The process's current record, read in a worker thread."""
        record: ProcessRecord = await self._supervisor.run_sync(
            self._supervisor.registry.get, self.process_id
        )
        return record

    async def send(
        self,
        data: bytes | str,
        *,
        command_id: str | None = None,
        eof: bool = False,
        redact: bool = False,
    ) -> bool:
        """Write ``data`` (str: UTF-8) to the process's terminal (``start(..., pty=True)``),
        as ``Supervisor.send`` does it, in a worker thread: journalled as an ``input_sent``
        fact under ``command_id`` first, then written (``eof``: its end of input after it).
        ``False`` when that command id is on record already: nothing is written again. Once
        begun, a send runs to its end even if the awaiting task is cancelled (the worker
        thread is not interrupted: a send is never half journalled).

        Raises:
            InputRefused: it has no terminal (started without ``pty``) or it has ended.
            StdinError: it did not read its input in time, or closed its side.
            ReplayConflict: ``command_id`` was used with other input.
        """
        send = functools.partial(
            self._supervisor.supervisor.send,
            self.sync,
            data,
            command_id=command_id,
            eof=eof,
            redact=redact,
        )
        applied: bool = await self._supervisor.run_sync(send)
        return applied

    async def resize(self, rows: int, cols: int) -> None:
        """Set the window of the process's terminal; the kernel tells its foreground group
        (SIGWINCH). Done on the loop: one ``ioctl``, which does not block.

        Raises:
            ValueError: ``rows`` or ``cols`` is not 1 to 65535.
            InputRefused: it has no terminal (started without ``pty``) or it has ended.
        """
        size = TerminalSize(rows, cols)
        terminal = self._supervisor.supervisor.terminal(self.sync)
        try:
            if terminal is None:
                raise ValueError("no terminal")
            terminal.resize(size)
        except (OSError, ValueError):  # none, or closed as it ended (its descriptor -1, EBADF)
            raise InputRefused(
                f"process {self.process_id!r} has no terminal to resize: it was started "
                "without pty=True, or it has ended"
            ) from None

    def output(
        self,
        *,
        follow: bool = True,
        stream: str | None = None,
        since_offset: int | tuple[int, int] = 0,
    ) -> AsyncGenerator[Chunk, None]:
        """Its captured output (docs/design.md §14): what is on disk, then, with ``follow``,
        new bytes as they come until the process has ended. A process on a terminal
        (``pty``) has one merged stream, kept as ``stdout``. Cancelling the iterating task
        ends the reading, not the child.

        Raises (when iterated):
            OutputUnavailable: it was started with ``capture=False``.
            ValueError: ``stream`` is not ``stdout``/``stderr``, or an offset is negative.
        """
        return output_chunks(
            self._supervisor.registry,
            self.process_id,
            follow=follow,
            stream=stream,
            since_offset=since_offset,
            root=self._supervisor.output_dir,
            limiter=self._supervisor.limiter,
        )


class AsyncSupervisor:
    """A ``Supervisor`` driven from one event loop (asyncio or trio, through anyio).

    ``async with AsyncSupervisor(registry, owner=owner) as sup``, then ``await sup.start(argv,
    ...)`` with every option of ``Supervisor.start``. Children are watched by the loop, not by
    a thread each; blocking store calls run in at most ``threads`` worker threads, and each
    terminal is recorded in one of ``SETTLE_THREADS`` more, so a stop waiting for a terminal
    never starves the thread that records it.
    """

    SETTLE_THREADS: Final = 2

    def __init__(
        self,
        registry: ProcessRegistry,
        *,
        owner: LeaseOwner,
        on_exit: OnExit = "stop",
        threads: int = 3,
        on_files: Callable[[str, FileCapture], None] | None = None,
        on_reaped: Callable[[str, Usage], None] | None = None,
        **options: Any,
    ) -> None:
        """Supervise as ``owner`` from the running event loop.

        Args:
            registry: the ledger every lifecycle event is written to.
            owner: who holds the leases (``Supervisor``'s ``owner``).
            on_exit: leaving ``async with`` stops the children still running (``"stop"``:
                each is recorded ``runner_shutdown``) or leaves them running, each watched
                by an owner thread from then on (``"leave"``).
            threads: worker threads for store calls, stops and output reads (at least 1).
            on_files: with ``output_files=True``, told (on a worker thread) of each run's
                output files as its child is spawned: whoever follows them (the host agent).
            on_reaped: told (on whichever thread reaps it) of what each child used, as the
                kernel counted it when it was reaped (the host agent records it, §18.10).
            options: the ``Supervisor``'s other options (``notifier``, ``stop``,
                ``timings``, ``outbox``, ``notice``, ``subreaper``, ``output_dir``).

        Raises:
            ValueError: ``on_exit`` is neither ``"stop"`` nor ``"leave"``, or ``threads`` < 1.
            TypeError: ``watch`` was given (the event loop is the watcher here).
        """
        _check_options(on_exit, threads, options)
        self.registry = registry
        self.output_dir: Path | None = options.get("output_dir")
        self.limiter = CapacityLimiter(threads)
        self._settlers = CapacityLimiter(self.SETTLE_THREADS)
        self._starts: Batches[tuple[Sequence[str], dict[str, Any]], _Started] = Batches(
            self._start_all_in_thread, self.limiter, most=BATCH_MOST
        )
        self._settles: Batches[_Watched, ProcessRecord | None] = Batches(
            self._settle_all, self._settlers, most=BATCH_MOST
        )
        self._on_exit: OnExit = on_exit
        self._on_files = on_files
        self._on_reaped = on_reaped
        self._local = threading.local()
        self._watched: dict[str, _Watched] = {}
        self._owned: dict[str, int] = {}  # restarts' attempts on owner threads: OS pid by id
        self._group: TaskGroup | None = None
        self.supervisor = Supervisor(registry, owner=owner, watch=self._hand_over, **options)

    @property
    def on_exit(self) -> OnExit:
        """What leaving ``async with`` does to the children still running (settable until
        then: an agent decides at its stop whether its children stay)."""
        return self._on_exit

    @on_exit.setter
    def on_exit(self, value: OnExit) -> None:
        if value not in ("stop", "leave"):
            raise ValueError(f"on_exit must be 'stop' or 'leave', not {value!r}")
        self._on_exit = value

    @property
    def watching(self) -> int:
        """How many children this loop watches now."""
        return len(self._watched)

    def children(self) -> dict[str, int]:
        """The process id and OS pid of each child running here -- watched by this loop, or a
        restart's attempt on an owner thread (the host agent samples their trees,
        docs/design.md §18.10)."""
        watched = {
            watched.handle.process_id: watched.child.pid
            for watched in list(self._watched.values())
            if watched.handle is not None
        }
        return {**dict(self._owned), **watched}

    async def __aenter__(self) -> AsyncSupervisor:
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group = group
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        """Stop (or leave) the children still running, as ``on_exit`` says; the terminals of
        those stopped are recorded before this returns. An exception that ended the block
        leaves it as it was raised, not wrapped in the watchers' task group's
        ``ExceptionGroup`` (the watchers raise nothing of their own)."""
        group, self._group = self._group, None
        assert group is not None, "AsyncSupervisor: __aexit__ without __aenter__"
        try:
            if self._on_exit == "stop":
                with anyio.CancelScope(shield=True):
                    await self._shutdown()
            else:
                group.cancel_scope.cancel()  # each watcher hands its child to an owner thread
        finally:
            try:
                suppressed = await group.__aexit__(exc_type, exc, traceback)
            except BaseExceptionGroup as wrapped:
                if exc is None or list(wrapped.exceptions) != [exc]:
                    raise
                suppressed = False  # the block's own exception propagates, unwrapped
        return suppressed

    async def _shutdown(self) -> None:
        """``Supervisor.shutdown`` with the trees stopped from the loop: each tree's stop
        steps (``OwnedChild.stop_steps``: SIGTERM, SIGKILL after the grace) run in the worker
        pool and their waits for the exit on the loop, so stopping any number of children
        takes no thread each. ``shutdown`` then stops whatever is left and joins."""
        policy = StopPolicy((signal.SIGTERM,), self.supervisor.stop_policy.grace_s)
        try:
            await self.run_sync(self.supervisor.begin_shutdown)
            async with anyio.create_task_group() as group:
                for watched in list(self._watched.values()):
                    if not watched.done.is_set():
                        group.start_soon(self._stop_tree, watched, policy)
        finally:
            await self.run_sync(self.supervisor.shutdown)  # whatever is left, and the joins

    async def _stop_tree(self, watched: _Watched, policy: StopPolicy) -> None:
        steps = watched.child.stop_steps(policy)
        done, timeout = await self.run_sync(_step, steps, None)
        while not done:
            with anyio.move_on_after(math.inf if timeout is None else timeout):
                await watched.exited.wait()
            done, timeout = await self.run_sync(_step, steps, watched.exited.is_set())

    async def run_sync(self, function: Any, *args: Any) -> Any:
        """``function(*args)`` in one of this supervisor's worker threads (bounded by
        ``threads``): how every blocking call here is made."""
        return await to_thread.run_sync(function, *args, limiter=self.limiter)

    # -- start ------------------------------------------------------------------------------

    def _hand_over(self, child: OwnedChild, settle: Settle) -> None:
        """The Supervisor's ``watch``: called on the worker thread running ``start`` -- or on
        a service's thread starting the next attempt of a restart policy (§15), which no
        ``start`` here awaits: that attempt gets an owner thread, as with the plain
        Supervisor (whose ``shutdown`` waits for it)."""
        if self._on_files is not None and settle.files is not None:
            self._on_files(settle.process_id, settle.files)
        if self._on_reaped is not None:
            child.on_reaped = functools.partial(self._on_reaped, settle.process_id)
        if getattr(self._local, "starting", False):
            self._local.watched[settle.handle] = _Watched(child, settle)
        else:
            self._owned[settle.process_id] = child.pid
            owner = functools.partial(self._settle_owned, settle)
            threading.Thread(target=owner, name="procledger-run", daemon=True).start()

    def _settle_owned(self, settle: Settle) -> None:
        """(An owner thread.) A restart's attempt, listed among ``children`` until settled."""
        try:
            settle()
        finally:
            self._owned.pop(settle.process_id, None)

    def _start_all_in_thread(
        self, calls: list[tuple[Sequence[str], dict[str, Any]]]
    ) -> list[_Started | Exception]:
        """Starts that gathered while others were under way: ``Supervisor.start_all``. A
        service's handle is its first attempt's, the child handed over here (§15)."""
        self._local.watched, self._local.starting = {}, True
        try:
            started = self.supervisor.start_all(calls)
            watched: dict[str, _Watched] = self._local.watched
            return [s if isinstance(s, Exception) else (s, watched.get(s.handle)) for s in started]
        finally:
            self._local.watched, self._local.starting = None, False

    async def start(self, argv: Sequence[str], **options: Any) -> AsyncProcessHandle:
        """Start ``argv`` as ``Supervisor.start`` does, with every one of its options (and
        those later issues add to it); returns once the child runs and that is recorded. A
        start under way completes even if the awaiting task is cancelled (the child is then
        watched as any other). A ``stdout`` consumer is called on the event loop's thread,
        as the pump drains the pipe there: it must be quick and must not block.

        Raises:
            SupervisorClosed: not inside ``async with`` (or the block has ended).
            As ``Supervisor.start``: ``TypeError``, ``ValueError``, ``OSError``,
            ``SupervisorClosed``, ``InvalidTransition``, ``LeaseLost``, ``SpawnError``.
        """
        group = self._group
        if group is None:
            raise SupervisorClosed("AsyncSupervisor.start: only inside its 'async with' block")
        with anyio.CancelScope(shield=True):
            handle, watched = await self._starts((argv, options))
            if watched is not None:
                watched.handle = handle
                self._watched[handle.handle] = watched
                group.start_soon(self._watch, watched, name=f"procledger-watch-{handle.handle}")
        return AsyncProcessHandle(self, handle)

    # -- watching ---------------------------------------------------------------------------

    async def _watch(self, watched: _Watched) -> None:
        """Step the child as its descriptors become ready until it completed, then record
        its terminal through the Supervisor's one completion path. Cancelled (``"leave"``,
        or the host's cancellation), the child goes to an owner thread instead."""
        try:
            while True:  # readiness first: a child that just started has nothing to say yet
                await _until_ready(watched.child)
                completed = watched.child.advance()
                if watched.child.exited:
                    watched.exited.set()
                if completed:
                    break
        except anyio.get_cancelled_exc_class():
            threading.Thread(target=watched.settle, name="procledger-run", daemon=True).start()
            watched.left = True
            watched.exited.set()  # a stop under way here stops waiting: ``shutdown`` finishes it
            self._forget(watched)
            raise
        with anyio.CancelScope(shield=True):
            watched.record = await self._settles(watched)
            self._forget(watched)

    def _forget(self, watched: _Watched) -> None:
        """Done watching: waiters already holding ``watched`` wake to its record; later ones
        ask the Supervisor, which keeps what it must of a finished run (a loop that starts
        children for weeks must not keep each child and record it ever watched)."""
        assert watched.handle is not None
        self._watched.pop(watched.handle.handle, None)
        watched.exited.set()  # a stop waiting for the exit must not outwait the watching
        watched.done.set()

    def _settle_all(self, batch: list[_Watched]) -> list[ProcessRecord | None]:
        """The Supervisor's completion path of children that ended (their terminals in one
        write), then the record each left -- read where no store call is needed; ``None``
        leaves ``wait`` to ask (a terminal another holder writes)."""
        Settle.together([watched.settle for watched in batch])
        return [self._record_left(watched) for watched in batch]

    def _record_left(self, watched: _Watched) -> ProcessRecord | None:
        try:
            assert watched.handle is not None
            return self.supervisor.wait(watched.handle, timeout=0)
        except Exception:  # ``wait`` raises it again, where it belongs
            return None

    # -- wait and stop ----------------------------------------------------------------------

    def _find(self, handle: AsyncProcessHandle) -> _Watched | None:
        return self._watched.get(handle.handle)

    async def wait(self, handle: AsyncProcessHandle) -> ProcessRecord:
        """``handle.wait()``: awaits the loop's own event, so any number of waiters cost no
        thread; cancelling one touches nothing else.

        Raises:
            NotFound: ``handle`` was not started here.
            StoreError: the terminal could not be written.
        """
        watched = self._find(handle)
        if watched is not None:
            await watched.done.wait()
            if watched.record is not None:
                return watched.record
        return await self._ask(self.supervisor.wait, handle, None)

    async def wait_ready(
        self, handle: AsyncProcessHandle, timeout: float | None = None
    ) -> ProcessRecord:
        """``handle.wait_ready()``: asks the Supervisor without blocking (``timeout=0``) and
        sleeps on the loop between asks -- 5 ms at first, doubling to 100 ms -- so waiters
        hold no thread while they wait.

        Raises:
            NotFound: ``handle`` was not started here.
            TimeoutError: not ready, and not ended, within ``timeout`` seconds.
        """
        return await self._ask(self.supervisor.wait_ready, handle, timeout)

    async def _ask(
        self, wait: Any, handle: AsyncProcessHandle, timeout: float | None
    ) -> ProcessRecord:
        """``wait(handle, 0)`` in a worker thread until it answers, sleeping on the loop
        between asks (5 ms, doubling to 100 ms): a waiter holds no thread, and cancelling
        it (or ``timeout``) ends only the waiting."""
        pause = READY_POLL_FIRST_S
        with anyio.fail_after(timeout):
            while True:
                try:
                    record: ProcessRecord = await self.run_sync(wait, handle.sync, 0)
                    return record
                except TimeoutError:
                    await anyio.sleep(pause)
                    pause = min(pause * 2, READY_POLL_MAX_S)

    async def stop(
        self, handle: AsyncProcessHandle, mode: StopMode | str, grace_s: float | None = None
    ) -> ProcessRecord:
        """``handle.stop(mode, grace_s)``: ``Supervisor.stop`` in a worker thread, shielded
        from cancellation once begun (a stop is never left half-done).

        Raises:
            NotFound: ``handle`` was not started here.
            ValueError: ``mode`` is not a stop mode.
        """
        stop_mode = StopMode(mode)
        with anyio.CancelScope(shield=True):
            record: ProcessRecord = await self.run_sync(
                self.supervisor.stop, handle.sync, stop_mode, grace_s
            )
        return record


def _check_options(on_exit: OnExit, threads: int, options: dict[str, Any]) -> None:
    if on_exit not in ("stop", "leave"):
        raise ValueError(f"on_exit must be 'stop' or 'leave', not {on_exit!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an int >= 1, not {threads!r}")
    if "watch" in options:
        raise TypeError("AsyncSupervisor watches its children itself: no 'watch' option")


def _step(steps: Generator[float | None, bool, bool], exited: bool | None) -> tuple[bool, Any]:
    """One stop step: (True, _) once the steps are done, else (False, how long to wait)."""
    try:
        return False, next(steps) if exited is None else steps.send(exited)
    except StopIteration:
        return True, None


async def _until_ready(child: OwnedChild) -> None:
    """Until one of the child's descriptors is ready -- or, once it has exited, ``POLL_S``
    (a stop from another thread, which closes no descriptor we wait for, is polled)."""
    descriptors = child.watched()
    with anyio.move_on_after(POLL_S if child.exited or not descriptors else math.inf):
        if len(descriptors) == 1:
            await _ready(*descriptors[0])
            return
        async with anyio.create_task_group() as group:
            for fd, write in descriptors:
                group.start_soon(_first_ready, fd, write, group.cancel_scope)


async def _ready(fd: int, write: bool) -> None:
    if write:
        await anyio.wait_writable(fd)
    else:
        await anyio.wait_readable(fd)


async def _first_ready(fd: int, write: bool, scope: anyio.CancelScope) -> None:
    await _ready(fd, write)
    scope.cancel()
