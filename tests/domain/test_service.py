"""Readiness, restart policies and their pure decisions (docs/design.md §15)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from procledger import InvalidTransition, OptionError, ProcessRecord
from procledger.domain.process import Process
from procledger.domain.registration import Originator, ProcessInput, ProcessRegistration
from procledger.domain.rendering import render_record
from procledger.domain.service import (
    JITTER,
    Readiness,
    RestartMode,
    RestartPolicy,
    age_ms,
    backoff_delay,
    check_port,
    check_regex,
    parse_duration,
    plan_restart,
)

ENV = "process-env:sha256:" + "0" * 64
UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "": 1.0}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0.2s", 0.2), ("1.6s", 1.6), ("60s", 60.0), ("5m", 300.0), ("1h", 3600.0), ("30", 30.0),
     ("250ms", 0.25), (" 2s ", 2.0), ("0", 0.0), (".5", 0.5), (1.5, 1.5), (3, 3.0),
     ("3d", 259200.0), ("1w", 604800.0)],
)  # fmt: skip
def test_durations_read_as_people_write_them(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@given(
    st.decimals(min_value=0, max_value=8_000, places=3, allow_nan=False),
    st.sampled_from(sorted(UNITS)),
)
def test_every_written_duration_means_number_times_unit(number: object, unit: str) -> None:
    text = f"{number}{unit}"
    assert parse_duration(text) == pytest.approx(float(str(number)) * UNITS[unit])


@pytest.mark.parametrize(
    "text", ["-1s", "-0.2", "1y", "s", "", "1.2.3s", "nan", "inf", "1e3", "400d"]
)
def test_bad_durations_are_one_line_option_errors(text: str) -> None:
    with pytest.raises(OptionError) as caught:
        parse_duration(text, option="--ready-timeout")
    assert caught.value.option == "--ready-timeout"
    assert str(caught.value).startswith("--ready-timeout: ")
    assert "\n" not in str(caught.value)


@given(st.text(max_size=12))
def test_any_text_is_a_duration_or_an_option_error(text: str) -> None:
    try:
        seconds = parse_duration(text)
    except OptionError:
        return
    assert seconds >= 0


def test_ages_share_the_grammar_without_the_upper_bound() -> None:
    """``--since``/``--older-than`` read durations as the options do, but a ledger may be
    older than the year a timeout is capped at."""
    assert age_ms("90s", option="--since") == 90_000
    assert age_ms("400d", option="--older-than") == 400 * 86_400_000
    with pytest.raises(OptionError, match="--older-than"):
        age_ms("yesterday", option="--older-than")


def test_ports_and_regexes_are_checked_before_use() -> None:
    assert check_port("8080") == 8080
    for bad in ("0", "65536", "-1", "http", True):
        with pytest.raises(OptionError, match="--ready-port"):
            check_port(bad, option="--ready-port")  # type: ignore[arg-type]
    assert check_regex(r"listening on \d+") == r"listening on \d+"
    with pytest.raises(OptionError, match="does not compile"):
        check_regex("(unclosed", option="--ready-output")
    with pytest.raises(ValidationError):
        Readiness(output="(unclosed")
    with pytest.raises(ValidationError):
        Readiness()  # no probe at all


def test_restart_modes_parse() -> None:
    assert RestartPolicy.parse("on-failure") is RestartMode.on_failure
    assert RestartPolicy.parse("on_failure") is RestartMode.on_failure
    with pytest.raises(OptionError, match="restart"):
        RestartPolicy.parse("sometimes")


POLICY = RestartPolicy(
    mode=RestartMode.always, max_restarts=5, window_s=60, backoff_initial_s=0.2, backoff_max_s=1.6
)


def test_the_backoff_schedule_of_the_issue() -> None:
    assert [backoff_delay(POLICY, n, 0.5) for n in range(1, 7)] == pytest.approx(
        [0.2, 0.4, 0.8, 1.6, 1.6, 1.6]
    )


@given(st.integers(min_value=1, max_value=200), st.floats(min_value=0, max_value=1))
def test_jitter_stays_within_ten_percent(number: int, unit: float) -> None:
    base = min(0.2 * 2 ** min(number - 1, 64), 1.6)
    delay = backoff_delay(POLICY, number, unit)
    assert base * (1 - JITTER) - 1e-12 <= delay <= base * (1 + JITTER) + 1e-12


def test_six_failures_spend_five_restarts_per_minute() -> None:
    restarts: tuple[float, ...] = ()
    now, numbers = 0.0, []
    for _ in range(5):
        plan = plan_restart(
            POLICY, failed=True, stopped=False, restarts=restarts, now=now, healthy_s=0
        )
        assert plan.action == "restart"
        numbers.append(plan.number)
        restarts, now = plan.restarts, now + 1.0
    assert numbers == [1, 2, 3, 4, 5]
    last = plan_restart(POLICY, failed=True, stopped=False, restarts=restarts, now=now, healthy_s=0)
    assert last.action == "give_up"
    # Outside the window the budget is back.
    later = plan_restart(
        POLICY, failed=True, stopped=False, restarts=restarts, now=now + 120, healthy_s=0
    )
    assert later.action == "restart"


@given(
    st.sampled_from(list(RestartMode)),
    st.booleans(),
    st.booleans(),
    st.lists(st.floats(min_value=0, max_value=100), max_size=8),
)
def test_a_stop_or_never_never_restarts(
    mode: RestartMode, failed: bool, stopped: bool, times: list[float]
) -> None:
    policy = POLICY.model_copy(update={"mode": mode})
    plan = plan_restart(
        policy, failed=failed, stopped=stopped, restarts=tuple(times), now=100, healthy_s=0
    )
    if stopped or mode is RestartMode.never or (mode is RestartMode.on_failure and not failed):
        assert plan.action == "stop"
    else:
        assert plan.action in ("restart", "give_up")


def test_healthy_running_resets_the_count() -> None:
    policy = POLICY.model_copy(update={"reset_after_s": 10.0})
    spent = (1.0, 2.0, 3.0, 4.0, 5.0)
    plan = plan_restart(policy, failed=True, stopped=False, restarts=spent, now=20, healthy_s=11)
    assert (plan.action, plan.number) == ("restart", 1)


def _registration(**extra: object) -> ProcessRegistration:
    return ProcessRegistration(
        id="svc",
        input=ProcessInput.command(["true"], "/"),
        disposition="rerunnable",
        originator=Originator.host(),
        env_ref=ENV,
        **extra,  # type: ignore[arg-type]
    )


def test_a_registration_without_service_fields_hashes_as_before() -> None:
    plain = _registration()
    assert set(plain.model_dump(mode="json")) == {
        "id", "input", "disposition", "originator", "wake_target", "env_ref", "event_types",
        "descriptor", "definition",
    }  # fmt: skip
    served = _registration(readiness=Readiness(port=80), restart=POLICY, attempt=1)
    assert served.registration_hash() != plain.registration_hash()
    again = ProcessRegistration.model_validate(served.model_dump(mode="json"))
    assert again == served


def test_attempts_are_linked_consistently() -> None:
    assert _registration(attempt_of="svc-first", attempt=2).attempt == 2
    with pytest.raises(ValidationError):
        _registration(attempt_of="svc-first")
    with pytest.raises(ValidationError):
        _registration(attempt=3)


def test_ready_and_crash_loop_facts_on_the_aggregate() -> None:
    process = Process.register(_registration(readiness=Readiness(port=80), attempt=1), at_ms=1)
    with pytest.raises(InvalidTransition):
        process.record_ready(2, ["port:80"], at_ms=2)  # still starting
    process.record_started(3, at_ms=3, event_id=None)
    assert process.record_ready(4, ["port:80"], at_ms=4)
    assert not process.record_ready(5, ["port:80"], at_ms=5)  # told once
    with pytest.raises(InvalidTransition):
        process.record_crash_loop(5, 60, at_ms=6)  # not ended yet
    process.complete(
        "exited", "exited", exit_code=1, diagnostic=None, value=None, event_id=None,
        authority=None, at_ms=7,
    )  # fmt: skip
    assert process.record_crash_loop(5, 60, at_ms=8)
    assert not process.record_crash_loop(5, 60, at_ms=9)
    record = render_record(process, 1)
    assert (record.ready_at_ms, record.attempt, record.attempt_of, record.gave_up) == (
        4, 1, None, "crash_loop"
    )  # fmt: skip


STEPS = st.lists(st.sampled_from(["start", "ready", "end", "crash_loop"]), max_size=8)


@given(STEPS)
def test_ready_and_crash_loop_follow_their_rules_in_any_order(steps: list[str]) -> None:
    """``ready`` only once and only while running; ``crash_loop`` only once and only after the
    terminal; the record's two forms agree whatever the order."""
    from procledger.domain.rendering import record_document

    process = Process.register(_registration(readiness=Readiness(notify=True), attempt=1), at_ms=1)
    now = 1
    for step in steps:
        now += 1
        state = process.state
        try:
            if step == "start":
                process.record_started(now, at_ms=now, event_id=None)
            elif step == "ready":
                process.record_ready(now, ["notify"], at_ms=now)
            elif step == "end":
                process.complete(
                    "exited", "exited", exit_code=1, diagnostic=None, value=None,
                    event_id=None, authority=None, at_ms=now,
                )  # fmt: skip
            else:
                process.record_crash_loop(5, 60, at_ms=now)
        except InvalidTransition:
            if step == "ready":
                assert state.value != "running"
            if step == "crash_loop":
                assert not state.is_terminal
    record = render_record(process, 7)
    assert ProcessRecord.model_validate(record_document(process, 7)) == record
    if record.ready_at_ms is not None:
        ready_events = [e for e in process.collect_events() if isinstance(e, Process.Ready)]
        assert len(ready_events) == 1
    assert record.gave_up in (None, "crash_loop")
    if record.gave_up is not None:
        assert record.is_terminal
