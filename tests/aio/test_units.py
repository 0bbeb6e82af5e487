"""Pure parts of the async API: the cursor each feed change carries, the inbox's take/give-back
that the async iterator rests on, and the parameters it shares with the synchronous API."""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from procledger import LoopInbox, ProcessCompletionNotification, Supervisor
from procledger.aio import AsyncProcessHandle, AsyncSupervisor
from procledger.aio.feed import _with_cursors
from procledger.projections.feed import ChangeCursor


class Record:
    def __init__(self, seq: int) -> None:
        self.change_seq = seq


def test_records_sharing_a_change_seq_resume_before_the_first_until_the_last() -> None:
    records: list[Any] = [Record(s) for s in (5, 7, 7, 7, 9)]
    cursors = [c.cursor.value for c in _with_cursors(records, ChangeCursor(3), ChangeCursor(9))]
    assert cursors == [5, 5, 5, 7, 9]


def _parameters(function: Callable[..., Any], after: int) -> list[tuple[str, Any]]:
    listed = list(inspect.signature(function).parameters.values())[after:]
    return [(parameter.name, parameter.default) for parameter in listed]


@pytest.mark.parametrize("name", ["stop", "wait_ready"])
def test_the_awaitable_calls_name_their_parameters_as_the_supervisor_does(name: str) -> None:
    """One vocabulary (docs/design.md, conventions: durations in seconds are ``timeout`` and
    ``grace_s``): ``AsyncSupervisor``'s call takes ``Supervisor``'s parameters by the same names
    and defaults, and ``AsyncProcessHandle``'s the same less the handle it is."""
    sync = _parameters(getattr(Supervisor, name), after=1)
    assert _parameters(getattr(AsyncSupervisor, name), after=1) == sync
    assert _parameters(getattr(AsyncProcessHandle, name), after=1) == sync[1:]


def note() -> ProcessCompletionNotification:
    return ProcessCompletionNotification(
        command_id=uuid.uuid4(),
        session_id=uuid.uuid4(),
        loop_id=uuid.uuid4(),
        process_handle="h",
        state="exited",
        reason="exited",
    )


def test_take_hands_each_out_once_and_a_retry_is_still_a_duplicate() -> None:
    inbox = LoopInbox()
    first, second = note(), note()
    assert inbox.offer(first).disposition == "accepted"
    assert inbox.offer(second).disposition == "accepted"
    assert inbox.take() == first
    assert inbox.pending() == [second]
    assert inbox.offer(first).disposition == "duplicate"
    inbox.give_back(first)
    assert inbox.pending() == [second, first]
    assert inbox.take() == second
    inbox.consume(second.command_id)
    assert inbox.take() == first
    assert inbox.take() is None
    inbox.consume(first.command_id)
    assert inbox.offer(first).disposition == "duplicate"
