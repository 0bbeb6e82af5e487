"""The timeline's spans (docs/design.md §16.3): records in, the bars the page draws out. Pure
where it can be (``span``, ``spans``, ``outcome_class``, ``window_ms``); the readers run on a
ledger of every store kind with a clock the test moves, so which records a window holds is
exact."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from _stores import MemoryCase, PostgresCase, SQLiteCase, StoreCase
from procledger import (
    CompletionAuthority,
    Originator,
    ProcessInput,
    ProcessRecord,
    ProcessRegistration,
    ProcessRegistry,
    RecoveryDisposition,
    open_registry,
)
from procledger.domain.registration import env_ref_for
from procledger.domain.vocabulary import ProcessState, TerminalReason
from procledger.testing import FakeClock
from procledger.web import timeline
from procledger.web.timeline import outcome_class, read_ids, read_window, span, spans, window_ms
from procledger.web.views import QueryError

T0 = 1_800_000_000_000
KEY = CompletionAuthority.workflow_key("timeline-tests")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def registry(clock: FakeClock) -> Iterator[ProcessRegistry]:
    opened = open_registry("memory://", clock=clock)
    yield opened
    opened.close()


def registration(process_id: str) -> ProcessRegistration:
    return ProcessRegistration(
        id=process_id,
        input=ProcessInput.command(["/bin/sleep", "1"]),
        disposition=RecoveryDisposition.owner_bound,
        originator=Originator.host(),
        env_ref=env_ref_for({}),
    )


def started(registry: ProcessRegistry, clock: FakeClock, process_id: str) -> ProcessRecord:
    registry.register(registration(process_id))
    return registry.record_started(process_id, clock.now_ms)


def ended(registry: ProcessRegistry, process_id: str, exit_code: int = 0) -> ProcessRecord:
    return registry.record_completed(
        process_id, "exited", "exited", exit_code=exit_code, authority=KEY
    )


@pytest.fixture
def base(registry: ProcessRegistry, clock: FakeClock) -> ProcessRecord:
    """A plain running record, the model the pure tests vary."""
    return started(registry, clock, "base")


def attempt(base: ProcessRecord, number: int, **fields: Any) -> ProcessRecord:
    """Attempt ``number`` of the service ``svc`` (first id ``svc``), as ``model_copy`` of a
    real record: ``svc`` for the first, ``svc.N`` after it."""
    process_id = "svc" if number == 1 else f"svc.{number}"
    first = None if number == 1 else "svc"
    update = {"id": process_id, "attempt": number, "attempt_of": first, "name": "api"}
    return base.model_copy(update=update | fields)


def over(
    state: ProcessState, start: int | None, end: int, exit_code: int | None = None
) -> dict[str, Any]:
    return {
        "state": state,
        "exit_code": exit_code,
        "started_at_ms": start,
        "finished_at_ms": end,
        "updated_at_ms": end,
    }


# -- pure ------------------------------------------------------------------------------------


def test_a_restarted_service_is_one_row_of_attempts_with_its_backoffs_between(
    base: ProcessRecord,
) -> None:
    records = [
        attempt(base, 3, state=ProcessState.starting, started_at_ms=None, starts_at_ms=T0 + 900),
        attempt(base, 1, **over(ProcessState.exited, T0, T0 + 100, exit_code=3)),
        attempt(base, 2, **over(ProcessState.exited, T0 + 300, T0 + 400, exit_code=3)),
    ]
    drawn = spans(records, {}, from_ms=T0 - 1)
    assert [s["id"] for s in drawn] == ["svc", "svc.2", "svc.3"]  # by attempt: gaps between
    assert {s["service"] for s in drawn} == {"svc"}
    assert {s["label"] for s in drawn} == {"api"}  # a service's row is labelled by its name
    assert [s["outcome"] for s in drawn] == ["failed", "failed", "pending"]
    assert [(s["start_ms"], s["end_ms"]) for s in drawn] == [
        (T0, T0 + 100),
        (T0 + 300, T0 + 400),
        (None, None),  # waits out its backoff: the gap runs from T0+400 to its start
    ]
    assert drawn[2]["starts_at_ms"] == T0 + 900
    assert drawn[0]["href"] == "/processes/svc.1"  # the first attempt's own page, not the service
    assert drawn[1]["href"] == "/processes/svc.2"
    assert drawn[0]["text"] == "exit 3"


def test_a_running_attempt_has_no_end_and_an_unnamed_process_is_labelled_by_its_command(
    base: ProcessRecord,
) -> None:
    drawn = span(base)
    assert (drawn["outcome"], drawn["start_ms"], drawn["end_ms"]) == ("running", T0, None)
    assert (drawn["label"], drawn["service"], drawn["attempt"]) == ("/bin/sleep 1", "base", None)
    assert drawn["href"] == "/processes/base"


def test_a_stop_request_and_readiness_are_marked_at_their_times(base: ProcessRecord) -> None:
    ready = base.model_copy(update={"ready_at_ms": T0 + 50})
    drawn = spans([ready], {"base": T0 + 70}, from_ms=T0)
    assert (drawn[0]["ready_ms"], drawn[0]["stop_ms"]) == (T0 + 50, T0 + 70)
    assert span(base)["stop_ms"] is None
    assert span(base)["ready_ms"] is None


@pytest.mark.parametrize(
    ("state", "exit_code", "expected"),
    [
        (ProcessState.exited, 0, "ok"),
        (ProcessState.exited, 1, "failed"),
        (ProcessState.failed, None, "failed"),
        (ProcessState.timed_out, None, "failed"),
        (ProcessState.signaled, None, "signaled"),
        (ProcessState.interrupted, None, "stopped"),
        (ProcessState.terminated, None, "stopped"),
        (ProcessState.killed, None, "stopped"),
        (ProcessState.lost_on_restore, None, "lost"),
        (ProcessState.abandoned, None, "abandoned"),
        (ProcessState.running, None, "running"),
    ],
)
def test_each_outcome_has_its_class(
    base: ProcessRecord, state: ProcessState, exit_code: int | None, expected: str
) -> None:
    record = base.model_copy(update={"state": state, "exit_code": exit_code})
    assert outcome_class(record) == expected


def test_lost_and_abandoned_spans_end_when_they_were_recorded(base: ProcessRecord) -> None:
    lost = base.model_copy(update=over(ProcessState.lost_on_restore, T0, T0 + 500))
    assert (span(lost)["outcome"], span(lost)["end_ms"]) == ("lost", T0 + 500)
    never_ran = base.model_copy(
        update=over(ProcessState.abandoned, None, T0 + 900) | {"created_at_ms": T0 + 10}
    )
    drawn = span(never_ran)  # abandoned before it started: a moment from its registration
    assert (drawn["outcome"], drawn["start_ms"], drawn["end_ms"]) == (
        "abandoned",
        T0 + 10,
        T0 + 900,
    )


def test_only_what_reaches_into_the_window_is_drawn(base: ProcessRecord) -> None:
    old = base.model_copy(update={"id": "old"} | over(ProcessState.exited, T0 - 900, T0 - 500, 0))
    late = base.model_copy(update={"id": "late"} | over(ProcessState.exited, T0 - 900, T0 + 5, 0))
    still = base.model_copy(update={"id": "still", "started_at_ms": T0 - 10**9})
    assert [s["id"] for s in spans([old, late, still], {}, from_ms=T0)] == ["late", "still"]


@pytest.mark.parametrize(
    ("text", "ms"), [(None, 3_600_000), ("", 3_600_000), ("15m", 900_000), ("24h", 86_400_000)]
)
def test_a_window_is_a_duration(text: str | None, ms: int) -> None:
    assert window_ms(text) == ms


@pytest.mark.parametrize("text", ["2s", "8d", "soon", "-1h"])
def test_a_window_out_of_range_or_not_a_duration_is_a_query_error(text: str) -> None:
    with pytest.raises(QueryError, match="window"):
        window_ms(text)


# -- reading a window from a ledger, on every store ---------------------------------------------


class WindowReads(StoreCase):
    """The readers on a fresh ledger of one store kind, its clock moved by hand."""

    def test_a_window_holds_what_ran_in_it_and_what_still_runs(
        self, registry: ProcessRegistry, clock: FakeClock
    ) -> None:
        started(registry, clock, "long-ago-and-still")
        started(registry, clock, "long-ago-and-over")
        ended(registry, "long-ago-and-over")
        for number in range(30):  # many changes before the window: the bisection skips them
            clock.now_ms += 1_000
            started(registry, clock, f"before-{number}")
            ended(registry, f"before-{number}")
        started(registry, clock, "ends-in-it")
        clock.now_ms += 3_600_000
        window_opens = clock.now_ms - 60_000
        ended(registry, "ends-in-it", exit_code=2)
        clock.now_ms += 1_000
        started(registry, clock, "stopped-in-it")
        clock.now_ms += 500
        registry.request_stop("stopped-in-it", TerminalReason.interrupted)
        stop_at = clock.now_ms
        clock.now_ms += 500
        registry.record_completed("stopped-in-it", "interrupted", "interrupted", authority=KEY)
        head = registry.latest_change_seq()
        found = read_window(registry, 60_000, clock.now_ms, head)
        drawn = {s["id"]: s for s in found["spans"]}
        assert set(drawn) == {"long-ago-and-still", "ends-in-it", "stopped-in-it"}
        assert drawn["ends-in-it"]["outcome"] == "failed"
        assert drawn["stopped-in-it"]["stop_ms"] == stop_at
        assert drawn["stopped-in-it"]["outcome"] == "stopped"
        assert (found["cursor"], found["truncated"], found["window_ms"]) == (head, False, 60_000)
        assert timeline.window_start(registry, window_opens, head) >= 60  # past the 30 before

    def test_a_busy_window_is_read_newest_first_up_to_its_bound(
        self, registry: ProcessRegistry, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(timeline, "MOST_CHANGES", 4)  # three changes a job: the last four
        for number in range(6):
            clock.now_ms += 10
            started(registry, clock, f"job-{number}")
            ended(registry, f"job-{number}")
        found = read_window(registry, 60_000, clock.now_ms, registry.latest_change_seq())
        assert found["truncated"] is True
        assert [s["id"] for s in found["spans"]] == ["job-4", "job-5"]

    def test_spans_by_id_are_what_a_batch_of_changes_named(
        self, registry: ProcessRegistry, clock: FakeClock
    ) -> None:
        started(registry, clock, "one")
        started(registry, clock, "two")
        found = read_ids(registry, ["two", "gone"], clock.now_ms)  # a pruned one is left out
        assert [s["id"] for s in found["spans"]] == ["two"]
        with pytest.raises(QueryError, match="at most 200"):
            read_ids(registry, [f"p{n}" for n in range(201)], clock.now_ms)


class TestMemoryWindows(MemoryCase, WindowReads):
    pass


class TestSQLiteWindows(SQLiteCase, WindowReads):
    pass


class TestPostgresWindows(PostgresCase, WindowReads):
    pass
