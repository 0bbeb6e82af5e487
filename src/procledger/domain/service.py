"""Readiness, waits and restart policies as plain data and pure decisions (docs/design.md §15).

What a caller may declare about a *service* -- a process that is useful once it is ready, and
that may be started again when it ends -- and every decision about it that needs no I/O: the
parsing of the options people type (durations, ports, regexes, policies), the backoff schedule,
and whether an ended attempt is followed by another, by nothing, or by a ``crash_loop``. The CLI
and the library both call these functions, so a flag and an argument mean the same; every
refusal is an ``OptionError`` naming the option, raised before anything is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Literal

from pydantic import Field, model_validator

from procledger.domain.durations import (
    MAX_DURATION_S,
    age_ms,
    ascii_digits,
    check_port,
    check_regex,
    parse_duration,
)
from procledger.domain.errors import OptionError
from procledger.domain.model import Frozen
from procledger.domain.probe_names import probe_names
from procledger.domain.vocabulary import MAX_LEDGER_INT

__all__ = [
    "BACKOFF_FACTOR",
    "JITTER",
    "MAX_DURATION_S",
    "Readiness",
    "RestartMode",
    "RestartPlan",
    "RestartPolicy",
    "age_ms",
    "backoff_delay",
    "check_port",
    "check_regex",
    "parse_duration",
    "plan_restart",
    "readiness_options",
    "restart_options",
]

BACKOFF_FACTOR: Final = 2.0
"""Each restart waits this many times longer than the one before, up to the policy's max."""
JITTER: Final = 0.10
"""A delay is spread by up to this fraction either way, so services restarted together do not
stampede together."""


class Readiness(Frozen):
    """When a process counts as ready: every probe given must hold (docs/design.md §15).

    ``port``: a TCP connect to ``host`` succeeds; ``output``: a line of stdout or stderr
    matches the regex; ``file``: the path exists; ``notify``: the child sent ``READY=1`` to the
    ``NOTIFY_SOCKET`` procledger set. ``timeout_s``: not ready in time ends the process
    ``failed``/``ready_timeout`` after its tree is stopped (none: wait for ever)."""

    port: int | None = Field(default=None, ge=1, le=65535)
    host: str = "127.0.0.1"
    output: str | None = None
    file: str | None = None
    notify: bool = False
    timeout_s: float | None = Field(default=None, gt=0, le=MAX_DURATION_S)

    @model_validator(mode="after")
    def _usable(self) -> Readiness:
        if self.output is not None:
            check_regex(self.output)
        if self.port is None and self.output is None and self.file is None and not self.notify:
            raise ValueError("readiness needs at least one probe (port, output, file, notify)")
        return self

    @property
    def probes(self) -> list[str]:
        """The probes as the ``ready`` fact names them, e.g. ``port:8080``."""
        return probe_names(self.model_dump())


class RestartMode(StrEnum):
    """When an ended attempt is followed by another."""

    never = "never"
    on_failure = "on-failure"
    always = "always"


class RestartPolicy(Frozen):
    """How a service is started again (docs/design.md §15): at most ``max_restarts`` restarts
    within any ``window_s``; the n-th restart since the last reset waits ``backoff_initial_s``
    × 2^(n-1), at most ``backoff_max_s``, ±10%; an attempt that ran (and was ready, if probed)
    for ``reset_after_s`` clears the count."""

    mode: RestartMode = RestartMode.on_failure
    max_restarts: int = Field(default=5, ge=0, le=MAX_LEDGER_INT)
    window_s: float = Field(default=60.0, gt=0, le=MAX_DURATION_S)
    backoff_initial_s: float = Field(default=0.2, ge=0, le=MAX_DURATION_S)
    backoff_max_s: float = Field(default=30.0, ge=0, le=MAX_DURATION_S)
    reset_after_s: float | None = Field(default=None, gt=0, le=MAX_DURATION_S)

    @model_validator(mode="after")
    def _ordered(self) -> RestartPolicy:
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError("backoff_max_s must be at least backoff_initial_s")
        return self

    @classmethod
    def parse(cls, mode: str, *, option: str = "--restart") -> RestartMode:
        """``never``, ``on-failure`` (or ``on_failure``) or ``always``; else ``OptionError``."""
        try:
            return RestartMode(mode.strip().replace("_", "-"))
        except ValueError:
            raise OptionError(
                option, f"{mode!r} is not a restart policy (never, on-failure, always)"
            ) from None


def backoff_delay(policy: RestartPolicy, number: int, unit: float) -> float:
    """Seconds before the ``number``-th restart since the last reset (1-based): the initial
    delay doubled per restart, capped, spread by ``JITTER`` -- ``unit`` in [0, 1] picks where
    in that spread (0.5: exactly on the schedule), so the caller owns the randomness."""
    if number < 1:
        raise ValueError(f"restart number {number} must be 1 or more")
    base = min(
        policy.backoff_initial_s * BACKOFF_FACTOR ** min(number - 1, 64), policy.backoff_max_s
    )
    return base * (1.0 + JITTER * (2.0 * min(max(unit, 0.0), 1.0) - 1.0))


@dataclass(frozen=True, slots=True)
class RestartPlan:
    """What follows an ended attempt: ``stop`` (nothing: the policy or a stop says so),
    ``restart`` (the ``number``-th restart since the last reset; ``restarts`` the restart times
    to remember) or ``give_up`` (the budget is spent: a ``crash_loop``)."""

    action: Literal["stop", "restart", "give_up"]
    number: int = 0
    restarts: tuple[float, ...] = ()


def plan_restart(
    policy: RestartPolicy,
    *,
    failed: bool,
    stopped: bool,
    restarts: tuple[float, ...],
    now: float,
    healthy_s: float,
) -> RestartPlan:
    """Decide after an attempt ended at ``now`` (seconds, any monotonic clock).

    ``failed``: its coarse status is ``failed``; ``stopped``: someone asked it (or the service)
    to stop, or its supervisor shuts down -- never restarted. ``restarts``: when the restarts
    since the last reset began; ``healthy_s``: how long the attempt ran (ready, if probed)."""
    if stopped or policy.mode is RestartMode.never:
        return RestartPlan("stop")
    if policy.mode is RestartMode.on_failure and not failed:
        return RestartPlan("stop")
    if policy.reset_after_s is not None and healthy_s >= policy.reset_after_s:
        restarts = ()
    recent = [t for t in restarts if now - t < policy.window_s]
    if len(recent) >= policy.max_restarts:
        return RestartPlan("give_up", restarts=restarts)
    return RestartPlan("restart", number=len(restarts) + 1, restarts=(*restarts, now))


def _flag_int(text: str | int, option: str) -> int:
    """A count a flag gives: a whole number from 0 to the largest the ledger keeps (the policy
    is stored: a larger one would fail only when written, as a ``TypeError``)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    elif isinstance(text, str):
        value = ascii_digits(text, option, "a whole number of 0 or more")
    else:
        raise OptionError(option, f"{text!r} is not a whole number of 0 or more")
    if value < 0:
        raise OptionError(option, f"{value} is negative")
    if value > MAX_LEDGER_INT:
        raise OptionError(option, f"{text!r} is more than the ledger can count ({MAX_LEDGER_INT})")
    return value


def readiness_options(
    *,
    port: str | int | None = None,
    output: str | None = None,
    file: str | None = None,
    notify: bool = False,
    timeout: str | float | None = None,
) -> Readiness | None:
    """``run``'s ``--ready-*`` flags as a ``Readiness`` (``None`` without a probe); every
    refusal an ``OptionError`` naming the flag."""
    checked_port = None if port is None else check_port(port, option="--ready-port")
    if output is not None:
        check_regex(output, option="--ready-output")
    if file is not None and not file.strip():
        raise OptionError("--ready-file", "the path is empty")
    seconds = None if timeout is None else parse_duration(timeout, option="--ready-timeout")
    if checked_port is None and output is None and file is None and not notify:
        if seconds is not None:
            raise OptionError("--ready-timeout", "needs a probe (--ready-port, --ready-output, "
                              "--ready-file or --ready-notify)")  # fmt: skip
        return None
    if seconds == 0:
        raise OptionError("--ready-timeout", "must be more than 0")
    return Readiness(port=checked_port, output=output, file=file, notify=notify, timeout_s=seconds)


def restart_options(
    *,
    restart: str | None = None,
    max_restarts: str | int | None = None,
    window: str | float | None = None,
    backoff_initial: str | float | None = None,
    backoff_max: str | float | None = None,
    reset_after: str | float | None = None,
) -> RestartPolicy | None:
    """``run``'s ``--restart`` and its companions as a ``RestartPolicy`` (``None`` without
    ``--restart`` or with ``never``); a companion without ``--restart`` is refused."""
    given = {
        "--max-restarts": max_restarts,
        "--restart-window": window,
        "--backoff-initial": backoff_initial,
        "--backoff-max": backoff_max,
        "--reset-after": reset_after,
    }
    if restart is None:
        for flag, value in given.items():
            if value is not None:
                raise OptionError(flag, "needs --restart on-failure or --restart always")
        return None
    mode = RestartPolicy.parse(restart)
    fields: dict[str, object] = {"mode": mode}
    if max_restarts is not None:
        fields["max_restarts"] = _flag_int(max_restarts, "--max-restarts")
    names = {"--restart-window": "window_s", "--backoff-initial": "backoff_initial_s"}
    names |= {"--backoff-max": "backoff_max_s", "--reset-after": "reset_after_s"}
    for flag, name in names.items():
        value = given[flag]
        if value is not None:
            fields[name] = parse_duration(value, option=flag)
    if fields.get("window_s") == 0 or fields.get("reset_after_s") == 0:
        flag = "--restart-window" if fields.get("window_s") == 0 else "--reset-after"
        raise OptionError(flag, "must be more than 0")
    if mode is RestartMode.never:
        return None
    try:
        return RestartPolicy.model_validate(fields)
    except ValueError as error:
        raise OptionError("--backoff-max", "must be at least --backoff-initial") from error
