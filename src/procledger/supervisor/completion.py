"""A run's one completion path (docs/design.md §6.2): wait for the child, decide its terminal,
write it (``TerminalWriter``: outbox first, then the write that releases the lease), and only
then publish its notification.

``stop``, ``shutdown``, a lost lease and stop requests made elsewhere only *signal* the tree
and note on the run what they asked; none of them writes a terminal, so exit, stop and shutdown
can race freely and still produce exactly one terminal, one lease release and one notification.
Who waits for the child is the supervisor's ``Watch``: an owner thread by default, or an event
loop that calls ``Settle`` once the child has ended (§17).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, final

from procledger.domain.records import ProcessRecord
from procledger.supervisor.decide import Outcome
from procledger.supervisor.execution import OwnedChild
from procledger.supervisor.file_capture import FileCapture
from procledger.supervisor.publishing import Publisher
from procledger.supervisor.runs import Run, RunTable
from procledger.supervisor.terminals import TerminalWriter
from procledger.supervisor.wiring import output_facts

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = ["Completion", "Settle", "Watch", "terminal_record"]

Watch = Callable[[OwnedChild, "Settle"], None]
"""Who waits for a started child (docs/design.md §6.2, §17). The default starts one owner
thread per child that calls ``settle`` at once (``settle`` then blocks in ``OwnedChild.wait``).
An event loop instead waits for ``child.watched()`` descriptors itself, calls
``child.advance()`` until it returns True, and only then calls ``settle`` (which no longer
waits for the child) in a worker thread: one code path records the outcome either way."""


class Completion:
    """Completes runs as the module docstring says; what fails is kept on its own run
    (``wait`` raises it)."""

    def __init__(self, writer: TerminalWriter, publisher: Publisher, table: RunTable) -> None:
        self._writer, self._publisher, self._table = writer, publisher, table

    def complete(self, run: Run) -> None:
        """The owner's work for one run: its child's status, its terminal, its notification."""
        try:
            result = self._ended(run)
            if result is not None:
                self._written(run, self._writer.record(run.ticket, run.keeper, result))
        except BaseException as error:
            if run.record is None and run.error is None:
                run.error = error
        finally:
            run.child.release()
            self._table.settle(run)

    def complete_all(self, runs: Sequence[Run]) -> None:
        """``complete`` of each run whose child has ended, with one terminal write for all."""
        try:
            due = [(run, result) for run in runs if (result := self._ended(run)) is not None]
            terminals = [(run.ticket, run.keeper, result) for run, result in due]
            for (run, _), written in zip(due, self._writer.record_all(terminals), strict=True):
                if isinstance(written, Exception):
                    run.error = written
                else:
                    self._written(run, written)
        except BaseException as error:
            for run in runs:
                if run.record is None and run.error is None:
                    run.error = error
        finally:
            for run in runs:
                run.child.release()
                self._table.settle(run)

    def _ended(self, run: Run) -> Outcome | None:
        """The run's terminal, once its child ended; ``None`` if there is none to write here
        (its lease was lost: the new holder records it) or deciding it failed (kept on the run)."""
        try:
            result = run.end(*run.child_status())
        except Exception as error:  # handed to the run it belongs to
            run.error = error
            return None
        if result is None:
            output_facts(run.ticket.capture)  # closes the capture; the new holder records it
        return result

    def _written(self, run: Run, record: ProcessRecord | None) -> None:
        """The terminal is on record (``None``: another holder's to record): notify."""
        run.record = record
        if record is None:
            return
        try:
            self._publisher.publish(run.ids.command_id, run.handle, run.notify_to, record)
        except Exception as error:  # kept on the run: its ``wait`` raises it
            run.error = error


@final
class Settle:
    """A run's one completion path: wait for the child (``OwnedChild.wait``), record its terminal
    (outbox first, then the write that releases the lease) and publish its notification. It may
    block; call it once (``settle()``), on a thread that may. Runs whose children have all
    ended settle together with ``Settle.together``: their terminals in one write."""

    __slots__ = ("_completion", "_run", "handle")

    def __init__(self, completion: Completion, run: Run) -> None:
        self._completion, self._run = completion, run
        self.handle = run.handle
        """The run's handle (what ``start`` returned for it)."""

    def __call__(self) -> None:
        self._completion.complete(self._run)

    @property
    def process_id(self) -> str:
        return self._run.process_id

    @property
    def files(self) -> FileCapture | None:
        """The run's output files, where its child writes its own (``output_files``): what a
        watcher that follows them enforces the bound on and feeds the probes from."""
        capture = self._run.ticket.capture
        return capture if isinstance(capture, FileCapture) else None

    @staticmethod
    def together(settles: Sequence[Settle]) -> None:
        """Each of ``settles``, with one terminal write per supervisor for all of them."""
        by_completion: dict[int, tuple[Completion, list[Run]]] = {}
        for settle in settles:
            entry = by_completion.setdefault(id(settle._completion), (settle._completion, []))
            entry[1].append(settle._run)
        for completion, runs in by_completion.values():
            completion.complete_all(runs)


def terminal_record(registry: ProcessRegistry, run: Run, deadline: float | None) -> ProcessRecord:
    """The run's terminal record once its completion path ran: what it wrote, what it failed
    with (raised), or -- the lease was lost -- what the new holder records, awaited until
    ``deadline`` (monotonic)."""
    run.done.wait()
    if run.thread is not None and run.thread is not threading.current_thread():
        run.thread.join()
    if run.error is not None:
        raise run.error
    if run.record is not None:
        return run.record
    remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
    return registry.await_terminal(run.process_id, timeout=remaining)
