"""The service file, ``procledger.toml``: the services ``procledger up`` keeps running, read
from TOML into checked definitions (docs/design.md §19.2).

Each key means what ``run``'s flag of the same job means -- the same parsers read durations,
ports, regexes, restart policies, sizes and signals -- so a service moved from a command line
into the file behaves the same. Every refusal is one ``ServiceFileError`` line,
``PATH:LINE:COL: KEY: what``: the place comes from ``toml_keys``, so a mistake found after
``tomllib`` parsed the text is placed like a syntax error. Pure: the caller reads the file and
says where it lives (``base_dir``) and which signals this host has.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import posixpath
import re
import shlex
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import Field, model_validator

from procledger.domain.durations import check_port, check_regex, parse_duration
from procledger.domain.errors import OptionError, ServiceFileError
from procledger.domain.model import Frozen, canonical_json
from procledger.domain.service import Readiness, RestartPolicy
from procledger.domain.service_names import check_service_name
from procledger.domain.sizes import POSIX_SIGNALS, parse_signal, parse_size
from procledger.domain.toml_keys import KeyPath, KeyPlaces, line_column
from procledger.domain.vocabulary import MAX_LEDGER_INT

__all__ = [
    "DEFAULT_GRACE_S",
    "DEFAULT_OUTPUT_LIMIT",
    "DEFAULT_STOP_SIGNAL",
    "MAX_GRACE_S",
    "ServiceDefinition",
    "ServiceFile",
    "parse_service_file",
]

SHELL: Final = ("/bin/sh", "-c")
"""How a command written as one string runs: through the shell, as a Procfile's line does
(``$PORT`` expanded, pipes and ``&&`` work); an array runs as written, with no shell."""
DEFAULT_OUTPUT_LIMIT: Final = 64 * 1024 * 1024
"""As ``run --output-limit``'s default: enough for a service's recent story, bounded."""
DEFAULT_GRACE_S: Final = 10.0
"""As ``run --grace``'s default."""
MAX_GRACE_S: Final = 86_400.0
"""As ``--grace``'s limit: a stop that waits longer than a day is a mistake, not a policy."""
DEFAULT_STOP_SIGNAL: Final = POSIX_SIGNALS["SIGTERM"]
"""SIGTERM: what a service manager sends first; its number is the same on every system."""

_DIGESTED: Final = frozenset(
    {"command", "cwd", "env", "ready", "restart", "output_limit", "stop_signal", "grace_s"}
    | {"labels", "port"}
)
"""What the running process is made of; ``name`` and ``depends_on`` only say which one and
when it starts, so they are left out of the digest."""


class ServiceDefinition(Frozen):
    """One ``[services.NAME]`` table, checked and normalized: what ``up`` starts, and what it
    compares (``digest``) with what runs to decide whether to restart it."""

    name: str
    command: tuple[str, ...] = Field(min_length=1)
    cwd: str
    """Absolute: the file's folder, or ``cwd`` resolved against it."""
    env: dict[str, str] = Field(default_factory=dict)
    ready: Readiness | None = None
    restart: RestartPolicy | None = Field(default_factory=RestartPolicy)
    """On failure by default, as a service manager's default is; mode ``never`` when the file
    says so (``None`` only if built so by hand)."""
    output_limit: int = Field(default=DEFAULT_OUTPUT_LIMIT, ge=0, le=MAX_LEDGER_INT)
    stop_signal: int = Field(default=DEFAULT_STOP_SIGNAL, ge=1)
    grace_s: float = Field(default=DEFAULT_GRACE_S, ge=0, le=MAX_GRACE_S)
    labels: dict[str, str] = Field(default_factory=dict)
    depends_on: tuple[str, ...] = ()
    port: int | Literal["auto"] | None = None
    """Passed to the service as ``$PORT``; ``auto``: leased from the file's port range."""

    @model_validator(mode="after")
    def _port_in_range(self) -> ServiceDefinition:
        if isinstance(self.port, int) and not 1 <= self.port <= 65535:
            raise ValueError(f"port {self.port} is out of range (1 to 65535)")
        return self

    def digest(self) -> str:
        """``sha256:HEX`` of what defines the running process, in canonical JSON: editing the
        command (or its env, probes, policy...) changes it; reformatting the file, reordering
        its keys or changing only ``depends_on`` does not."""
        document = self.model_dump(mode="json", include=set(_DIGESTED))
        return "sha256:" + hashlib.sha256(canonical_json(document)).hexdigest()


def start_order(depends_on: Mapping[str, Sequence[str]]) -> list[str]:
    """The names in an order to start them in: each after every name it depends on that is
    among them; of those free to start, the one listed first. A cycle (a file with one is
    refused when read; the desired state of several ``up`` runs may still hold one) is
    broken by starting its first name."""
    placed: set[str] = set()
    started: list[str] = []
    pending = list(depends_on)
    while pending:
        ready = (
            n for n in pending if all(d in placed or d not in depends_on for d in depends_on[n])
        )
        name = next(ready, pending[0])
        pending.remove(name)
        placed.add(name)
        started.append(name)
    return started


class ServiceFile(Frozen):
    """A whole service file: its services in file order, each dependency among them, none in
    a cycle (checked when built)."""

    path: str
    """As the user named it: every message about the file starts with it."""
    services: dict[str, ServiceDefinition]
    port_range: tuple[int, int] | None = None
    """``[ports] range``: where ``port = "auto"`` leases from (``None``: the default range)."""

    @model_validator(mode="after")
    def _consistent(self) -> ServiceFile:
        for name, service in self.services.items():
            if service.name != name:
                raise ValueError(f"service {name!r} is defined with the name {service.name!r}")
        for name, problem in _dependency_problems(self.services):
            raise ValueError(f"services.{name}.depends_on: {problem}")
        return self

    def order(self, names: Sequence[str] | None = None) -> list[str]:
        """The order to start in: every service after all it depends on, ties in file order;
        only ``names`` (all by default) and what they depend on, transitively. A name not in
        the file: ``OptionError`` naming ``NAME`` and listing the services."""
        wanted = self._closure(names, lambda name: self.services[name].depends_on)
        return start_order(
            {name: service.depends_on for name, service in self.services.items() if name in wanted}
        )

    def dependents_first(self, names: Sequence[str] | None = None) -> list[str]:
        """The order to stop in (``down``): ``order`` reversed, so nothing is stopped before
        what depends on it; only ``names`` (all by default) and what depends on them."""
        dependents: dict[str, list[str]] = {name: [] for name in self.services}
        for name, service in self.services.items():
            for needed in service.depends_on:
                dependents[needed].append(name)
        wanted = self._closure(names, dependents.__getitem__)
        return [name for name in reversed(self.order()) if name in wanted]

    def _closure(
        self, names: Sequence[str] | None, edges: Callable[[str], Iterable[str]]
    ) -> set[str]:
        """``names`` and everything reached from them by ``edges``."""
        if names is None:
            return set(self.services)
        for name in names:
            if name not in self.services:
                known = ", ".join(self.services)
                raise OptionError("NAME", f"no service {name!r} in {self.path} ({known})")
        reached: set[str] = set()
        todo = list(names)
        while todo:
            name = todo.pop()
            if name not in reached:
                reached.add(name)
                todo.extend(edges(name))
        return reached


def parse_service_file(
    text: str, *, path: str, base_dir: str, signals: Mapping[str, int] = POSIX_SIGNALS
) -> ServiceFile:
    """The service file ``text``: ``path`` is how messages name it, ``base_dir`` the absolute
    folder relative paths in it start from (the file's), ``signals`` this host's signal
    numbers by name (the default knows those POSIX fixes). A mistake of syntax or meaning:
    ``ServiceFileError``, one line starting ``PATH:LINE:COL:``."""
    if not posixpath.isabs(base_dir):
        raise ValueError(f"base_dir must be absolute, not {base_dir!r}")
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise _syntax_error(error, text, path) from None
    try:
        return _Reader(posixpath.normpath(base_dir), signals).file(document, path)
    except _Invalid as invalid:
        line, column = KeyPlaces.of(text).find(invalid.path)
        where = _dotted(invalid.path)
        raise ServiceFileError(
            path, f"{where}: {invalid.message}", line=line, column=column
        ) from None


_TOML_AT: Final = re.compile(
    r"(?P<what>.*?)\s*\((?:at line (?P<line>\d+), column (?P<column>\d+)|at end of document)\)",
    re.DOTALL,
)
"""Where ``tomllib`` says a syntax error is (the end of its message; Python 3.14 also keeps
the numbers as attributes, but 3.11 does not)."""


def _syntax_error(error: tomllib.TOMLDecodeError, text: str, path: str) -> ServiceFileError:
    found = _TOML_AT.fullmatch(str(error))
    what = found["what"] if found else str(error)
    if found and found["line"]:
        line, column = int(found["line"]), int(found["column"])
    else:
        line, column = line_column(text, len(text))
    what = what[:1].lower() + what[1:]
    return ServiceFileError(path, f"invalid TOML: {what}", line=line, column=column)


class _Invalid(Exception):
    """A value the file must not hold, at ``path``: placed in the text only if it escapes."""

    def __init__(self, path: KeyPath, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message


_BARE: Final = re.compile(r"[A-Za-z0-9_-]+")


def _dotted(path: KeyPath) -> str:
    """``services.web.command[0]``: the key as TOML writes it (quoted where it must be)."""
    text = ""
    for key in path:
        if isinstance(key, int):
            text += f"[{key}]"
        else:
            shown = key if _BARE.fullmatch(key) else json.dumps(key, ensure_ascii=False)
            text += f".{shown}" if text else shown
    return text or "(file)"


def _kind(value: object) -> str:
    """What TOML calls ``value``'s type, for "must be X, not Y"."""
    kinds: tuple[tuple[type, str], ...] = (
        (bool, "a boolean"),
        (int, "an integer"),
        (float, "a number"),
        (str, "a string"),
        (list, "an array"),
        (dict, "a table"),
    )
    return next((name for cls, name in kinds if isinstance(value, cls)), "a date or time")


def _expect(value: object, path: KeyPath, types: tuple[type, ...], what: str) -> None:
    """``value`` is one of ``types`` (a boolean is not an integer here), else refused."""
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise _Invalid(path, f"must be {what}, not {_kind(value)}")


def _table(
    value: object, path: KeyPath, what: str, allowed: Iterable[str] | None = None
) -> dict[str, Any]:
    """A table whose keys are all ``allowed`` (any, when ``None``); an unknown key is named,
    with the one likely meant."""
    _expect(value, path, (dict,), what)
    assert isinstance(value, dict)
    if allowed is None:
        return value
    keys = sorted(allowed)
    for key in value:
        if key not in keys:
            close = difflib.get_close_matches(key, keys, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise _Invalid((*path, key), f"unknown key{hint}; allowed: {', '.join(keys)}")
    return value


def _option(path: KeyPath, parse: Callable[[], Any]) -> Any:
    """``parse()``, the shared parser's ``OptionError`` said at ``path``."""
    try:
        return parse()
    except OptionError as error:
        raise _Invalid(path, str(error).removeprefix(f"{error.option}: ")) from None


def _text(value: object, path: KeyPath, what: str = "a string") -> str:
    """A non-empty string without NUL (which no argument, path or variable can hold)."""
    _expect(value, path, (str,), what)
    assert isinstance(value, str)
    if not value.strip():
        raise _Invalid(path, "is empty")
    if "\0" in value:
        raise _Invalid(path, "holds a NUL character, which no command, path or variable can")
    return value


def _duration(value: object, path: KeyPath, *, positive: bool = False) -> float:
    what = "a duration such as 30s, 5m or a number of seconds"
    _expect(value, path, (str, int, float), what)
    assert isinstance(value, str | int | float)
    seconds = float(_option(path, lambda: parse_duration(value)))
    if positive and seconds == 0:
        raise _Invalid(path, "must be more than 0")
    return seconds


def _count(value: object, path: KeyPath) -> int:
    _expect(value, path, (int,), "a whole number of 0 or more")
    assert isinstance(value, int)
    if not 0 <= value <= MAX_LEDGER_INT:
        raise _Invalid(path, f"{value} is not from 0 to {MAX_LEDGER_INT}")
    return value


def _dependency_problems(services: Mapping[str, ServiceDefinition]) -> list[tuple[str, str]]:
    """(service, what is wrong with its ``depends_on``): names not in the file, then the first
    cycle found in file order (``db -> web -> db``: each depends on the next)."""
    known = ", ".join(services)
    problems = [
        (name, f"{needed!r} is not a service of this file ({known})")
        for name, service in services.items()
        for needed in service.depends_on
        if needed not in services
    ]
    if problems:
        return problems
    cycle = _first_cycle({name: service.depends_on for name, service in services.items()})
    return [] if cycle is None else [(cycle[0], f"a cycle: {' -> '.join(cycle)}")]


def _first_cycle(graph: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A cycle of ``graph`` as the path that closes it, searched depth first in file order;
    iterative, so a long chain of dependencies cannot exhaust the stack."""
    done: set[str] = set()
    for start in graph:
        trail = [start]
        stack = [iter(graph[start])]
        while stack:
            needed = next(stack[-1], None)
            if needed is None:
                done.add(trail.pop())
                stack.pop()
            elif needed in trail:
                return [*trail[trail.index(needed) :], needed]
            elif needed not in done:
                trail.append(needed)
                stack.append(iter(graph[needed]))
    return None


@dataclass(frozen=True)
class _Reader:
    """Reads the parsed TOML into definitions; each key's reader refuses with its path."""

    base_dir: str
    signals: Mapping[str, int]

    def file(self, document: dict[str, Any], path: str) -> ServiceFile:
        _table(document, (), "a table", ("services", "ports"))
        port_range = self.ports(document["ports"]) if "ports" in document else None
        none = "no services: add a [services.NAME] table with a command"
        if "services" not in document:
            raise _Invalid(("services",), none)
        where = ("services",)
        table = document["services"]
        _expect(table, where, (dict,), "a table of services ([services.NAME])")
        if not table:
            raise _Invalid(where, none)
        services = {name: self.service(name, value) for name, value in table.items()}
        for name, problem in _dependency_problems(services):
            raise _Invalid(("services", name, "depends_on"), problem)
        return ServiceFile(path=path, services=services, port_range=port_range)

    def ports(self, value: object) -> tuple[int, int]:
        table = _table(value, ("ports",), "a table ([ports] range = ...)", ("range",))
        if "range" not in table:
            raise _Invalid(("ports",), 'needs a range such as range = "20000-29999"')
        path = ("ports", "range")
        text = _text(table["range"], path, 'a port range such as "20000-29999"')
        low, dash, high = text.partition("-")
        if not dash:
            raise _Invalid(path, f"{text!r} is not a port range such as 20000-29999")
        first = _option(path, lambda: check_port(low, option="range"))
        last = _option(path, lambda: check_port(high, option="range"))
        if first > last:
            raise _Invalid(path, f"{text!r} runs backwards: write the lower port first")
        return first, last

    def service(self, name: str, value: object) -> ServiceDefinition:
        path: KeyPath = ("services", name)
        _option(path, lambda: check_service_name(name, option="name"))
        table = _table(value, path, "a table of the service's keys", _KEYS)
        if "command" not in table:
            raise _Invalid(path, "has no command: add command = ... (what to run)")
        fields: dict[str, Any] = {"name": name, "cwd": self.base_dir}
        for key, raw in table.items():
            field, read = _KEYS[key]
            fields[field] = read(self, raw, (*path, key))
        if fields.get("port") is not None and "PORT" in fields.get("env", {}):
            raise _Invalid((*path, "env", "PORT"), "is set by port: keep one of the two")
        ready = fields.get("ready")
        if ready is not None and ready.file is not None:
            fields["ready"] = ready.model_copy(
                update={"file": posixpath.join(fields["cwd"], ready.file)}
            )
        try:
            return ServiceDefinition.model_validate(fields)
        except ValueError as error:  # what each key's reader let through: a bug's safety net
            raise _Invalid(path, " ".join(str(error).split())) from None

    def command(self, value: object, path: KeyPath) -> tuple[str, ...]:
        what = "a command line or an array of its words"
        _expect(value, path, (str, list), what)
        if isinstance(value, str):  # a Procfile's line: the shell expands $PORT, pipes...
            try:
                words = shlex.split(value)
            except ValueError as error:
                raise _Invalid(path, f"{value!r} cannot be split into words: {error}") from None
            if not words:
                raise _Invalid(path, "is empty: name the program to run")
            if "\0" in value:
                raise _Invalid(path, "holds a NUL character, which no command can")
            return (*SHELL, value)
        assert isinstance(value, list)
        if not value:
            raise _Invalid(path, "is empty: name the program to run")
        for index, word in enumerate(value):
            _expect(word, (*path, index), (str,), "a string")
            if "\0" in word:
                raise _Invalid((*path, index), "holds a NUL character, which no command can")
        if not value[0]:
            raise _Invalid((*path, 0), "is empty: name the program to run")
        return tuple(value)

    def cwd(self, value: object, path: KeyPath) -> str:
        text = _text(value, path, "a path")
        if text.startswith("~"):
            raise _Invalid(path, f"{text!r}: '~' is not expanded here; write the path in full")
        return posixpath.normpath(posixpath.join(self.base_dir, text))

    def env(self, value: object, path: KeyPath) -> dict[str, str]:
        table = _table(value, path, "a table of variables")
        return {name: _env_value(name, raw, (*path, name)) for name, raw in table.items()}

    def ready(self, value: object, path: KeyPath) -> Readiness:
        what = "a table of probes (port, output, file, notify)"
        table = _table(value, path, what, _READY_KEYS)
        fields: dict[str, Any] = {}
        for key, raw in table.items():
            fields[_READY_KEYS[key][0]] = _READY_KEYS[key][1](raw, (*path, key))
        if not {"port", "output", "file", "notify"} & {k for k, v in fields.items() if v}:
            raise _Invalid(path, "needs a probe: port, output, file or notify = true")
        try:
            return Readiness.model_validate(fields)
        except ValueError as error:
            raise _Invalid(path, " ".join(str(error).split())) from None

    def restart(self, value: object, path: KeyPath) -> RestartPolicy:
        _expect(value, path, (str, dict), "a policy (never, on-failure, always) or a table")
        if isinstance(value, str):
            return RestartPolicy(mode=_mode(value, path))
        table = _table(value, path, "a table", _RESTART_KEYS)
        fields: dict[str, Any] = {}
        for key, raw in table.items():
            fields[_RESTART_KEYS[key][0]] = _RESTART_KEYS[key][1](raw, (*path, key))
        policy = RestartPolicy.model_construct(**fields)
        if policy.backoff_max_s < policy.backoff_initial_s:
            if "backoff_max" in table:
                message = f"must be at least backoff_initial ({policy.backoff_initial_s:g}s)"
                raise _Invalid((*path, "backoff_max"), message)
            message = f"is more than backoff_max ({policy.backoff_max_s:g}s by default)"
            raise _Invalid((*path, "backoff_initial"), message)
        return RestartPolicy.model_validate(fields)

    def output_limit(self, value: object, path: KeyPath) -> int:
        _expect(value, path, (str, int), "a size such as 64MiB or a number of bytes")
        assert isinstance(value, str | int)
        return int(_option(path, lambda: parse_size(value)))

    def stop_signal(self, value: object, path: KeyPath) -> int:
        _expect(value, path, (str, int), "a signal such as SIGTERM, TERM or 15")
        assert isinstance(value, str | int)
        names = self.signals
        return int(_option(path, lambda: parse_signal(value, names=names)))

    def grace(self, value: object, path: KeyPath) -> float:
        seconds = _duration(value, path)
        if seconds > MAX_GRACE_S:
            raise _Invalid(path, f"{value!r} is longer than a day: a stop waits at most that")
        return seconds

    def labels(self, value: object, path: KeyPath) -> dict[str, str]:
        table = _table(value, path, "a table of labels")
        for name, raw in table.items():
            _expect(raw, (*path, name), (str,), "a string")
        return dict(table)

    def depends_on(self, value: object, path: KeyPath) -> tuple[str, ...]:
        _expect(value, path, (str, list), "an array of service names")
        names = [value] if isinstance(value, str) else value
        assert isinstance(names, list)
        for index, name in enumerate(names):
            _expect(name, (*path, index), (str,), "a service name")
            if name in names[:index]:
                raise _Invalid(path, f"{name!r} is listed twice")
        return tuple(names)

    def port(self, value: object, path: KeyPath) -> int | Literal["auto"]:
        _expect(value, path, (int, str), 'a port number or "auto"')
        if value == "auto":
            return "auto"
        if not isinstance(value, int):
            raise _Invalid(path, f'{value!r} is neither a port number nor "auto"')
        return int(_option(path, lambda: check_port(value)))


def _env_value(name: str, value: object, path: KeyPath) -> str:
    """A variable's value as a shell would see it: ``true``, ``8080``, ``0.5``."""
    if not name or "=" in name or "\0" in name:
        raise _Invalid(path, f"{name!r} cannot name an environment variable (no '=', no NUL)")
    _expect(value, path, (str, int, float, bool), "a string, number or boolean")
    if isinstance(value, bool):
        return "true" if value else "false"
    text = value if isinstance(value, str) else repr(value)
    if "\0" in text:
        raise _Invalid(path, "holds a NUL character, which no variable can")
    return text


_Read = Callable[[_Reader, Any, KeyPath], Any]
_KEYS: Final[Mapping[str, tuple[str, _Read]]] = {
    "command": ("command", _Reader.command),
    "cwd": ("cwd", _Reader.cwd),
    "env": ("env", _Reader.env),
    "ready": ("ready", _Reader.ready),
    "restart": ("restart", _Reader.restart),
    "output_limit": ("output_limit", _Reader.output_limit),
    "stop_signal": ("stop_signal", _Reader.stop_signal),
    "grace": ("grace_s", _Reader.grace),
    "labels": ("labels", _Reader.labels),
    "depends_on": ("depends_on", _Reader.depends_on),
    "port": ("port", _Reader.port),
}
"""A service's keys: the field each fills, and its reader."""


def _ready_port(value: object, path: KeyPath) -> int:
    _expect(value, path, (int,), "a port number")
    assert isinstance(value, int)
    return int(_option(path, lambda: check_port(value)))


def _mode(value: object, path: KeyPath) -> Any:
    _expect(value, path, (str,), "a policy (never, on-failure, always)")
    assert isinstance(value, str)
    return _option(path, lambda: RestartPolicy.parse(value))


def _regex(value: object, path: KeyPath) -> str:
    text = _text(value, path, "a regular expression")
    return str(_option(path, lambda: check_regex(text)))


def _flag(value: object, path: KeyPath) -> bool:
    _expect(value, path, (bool,), "true or false")
    return bool(value)


_Parse = Callable[[Any, KeyPath], Any]
_READY_KEYS: Final[Mapping[str, tuple[str, _Parse]]] = {
    "port": ("port", _ready_port),
    "host": ("host", _text),
    "output": ("output", _regex),
    "file": ("file", _text),
    "notify": ("notify", _flag),
    "timeout": ("timeout_s", lambda value, path: _duration(value, path, positive=True)),
}
_RESTART_KEYS: Final[Mapping[str, tuple[str, _Parse]]] = {
    "mode": ("mode", _mode),
    "max_restarts": ("max_restarts", _count),
    "window": ("window_s", lambda value, path: _duration(value, path, positive=True)),
    "backoff_initial": ("backoff_initial_s", _duration),
    "backoff_max": ("backoff_max_s", _duration),
    "reset_after": ("reset_after_s", lambda value, path: _duration(value, path, positive=True)),
}
