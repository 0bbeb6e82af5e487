"""The service file, ``procledger.toml`` (docs/design.md §19.2): what each key means, that every
mistake is one line placed at its line and column, the start and stop orders, and a digest that
follows what runs, not how the file is written. Also the grammars it shares with ``run``
(sizes, signals) and the service name rule."""

from __future__ import annotations

import itertools
import json
import re
import textwrap
import tomllib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from procledger.domain.errors import OptionError, ServiceFileError
from procledger.domain.service import Readiness, RestartMode, RestartPolicy
from procledger.domain.service_file import (
    DEFAULT_OUTPUT_LIMIT,
    ServiceDefinition,
    ServiceFile,
    parse_service_file,
)
from procledger.domain.service_names import SERVICE_NAME, check_service_name
from procledger.domain.sizes import POSIX_SIGNALS, parse_signal, parse_size
from procledger.domain.toml_keys import KeyPlaces

BASE = "/srv/app"
LINUX_SIGNALS = {**POSIX_SIGNALS, "SIGUSR1": 10, "SIGUSR2": 12, "SIGIOT": 6}


def parsed(text: str) -> ServiceFile:
    return parse_service_file(
        textwrap.dedent(text), path="procledger.toml", base_dir=BASE, signals=LINUX_SIGNALS
    )


def refused(text: str) -> ServiceFileError:
    with pytest.raises(ServiceFileError) as caught:
        parsed(text)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("procledger.toml:"), message
    return caught.value


# -- what each key means ------------------------------------------------------------------------


def test_a_full_service_is_read_as_run_s_flags_would_be() -> None:
    loaded = parsed(
        """\
        [ports]
        range = "20000-29999"

        [services.db]
        command = "postgres -D 'my data'"
        ready = { port = 5432, timeout = "30s" }

        [services.web]
        command = ["python", "-m", "http.server"]
        cwd = "web/../site"
        env = { DEBUG = true, WORKERS = 3, RATIO = 0.5, NAME = "x" }
        ready = { output = "listening", file = "run/ready", notify = true, host = "::1" }
        restart = { mode = "always", max_restarts = 3, window = "2m", backoff_initial = "1s", backoff_max = "1m", reset_after = 300 }
        output_limit = "1MiB"
        stop_signal = "INT"
        grace = "2.5s"
        labels = { tier = "front" }
        depends_on = ["db"]
        port = "auto"
        """  # noqa: E501
    )
    assert loaded.port_range == (20000, 29999)
    db, web = loaded.services["db"], loaded.services["web"]
    assert db.command == ("/bin/sh", "-c", "postgres -D 'my data'")  # a Procfile's line
    assert db.cwd == BASE
    assert db.ready == Readiness(port=5432, timeout_s=30.0)
    assert db.restart == RestartPolicy()  # on-failure, with the policy's defaults
    assert (db.output_limit, db.stop_signal, db.grace_s) == (DEFAULT_OUTPUT_LIMIT, 15, 10.0)
    assert (db.env, db.labels, db.depends_on, db.port) == ({}, {}, (), None)
    assert web.command == ("python", "-m", "http.server")
    assert web.cwd == "/srv/app/site"
    assert web.env == {"DEBUG": "true", "WORKERS": "3", "RATIO": "0.5", "NAME": "x"}
    assert web.ready == Readiness(
        output="listening", file="/srv/app/site/run/ready", notify=True, host="::1"
    )
    assert web.restart == RestartPolicy(
        mode=RestartMode.always,
        max_restarts=3,
        window_s=120.0,
        backoff_initial_s=1.0,
        backoff_max_s=60.0,
        reset_after_s=300.0,
    )
    assert (web.output_limit, web.stop_signal, web.grace_s) == (1024 * 1024, 2, 2.5)
    assert (web.labels, web.depends_on, web.port) == ({"tier": "front"}, ("db",), "auto")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('"never"', RestartPolicy(mode=RestartMode.never)),
        ('"on_failure"', RestartPolicy()),
        ('"always"', RestartPolicy(mode=RestartMode.always)),
        ("{ max_restarts = 0 }", RestartPolicy(max_restarts=0)),
    ],
)
def test_a_restart_policy_is_a_mode_or_a_table(value: str, expected: RestartPolicy) -> None:
    loaded = parsed(f'[services.w]\ncommand = "x"\nrestart = {value}\n')
    assert loaded.services["w"].restart == expected


@pytest.mark.parametrize(
    ("key", "value", "field", "expected"),
    [
        ("output_limit", "0", "output_limit", 0),
        ("output_limit", "4096", "output_limit", 4096),
        ("output_limit", '"512 KiB"', "output_limit", 512 * 1024),
        ("stop_signal", "9", "stop_signal", 9),
        ("stop_signal", '"SIGUSR1"', "stop_signal", 10),
        ("stop_signal", '"iot"', "stop_signal", 6),
        ("grace", "0", "grace_s", 0.0),
        ("grace", "1.5", "grace_s", 1.5),
        ("grace", '"1m"', "grace_s", 60.0),
        ("port", "8080", "port", 8080),
        ("depends_on", '"db"', "depends_on", ("db",)),
        ("cwd", '"/abs/./path/"', "cwd", "/abs/path"),
    ],
)
def test_each_key_takes_what_its_flag_takes(
    key: str, value: str, field: str, expected: object
) -> None:
    extra = '[services.db]\ncommand = "y"\n' if key == "depends_on" else ""
    loaded = parsed(f'[services.w]\ncommand = "x"\n{key} = {value}\n{extra}')
    assert getattr(loaded.services["w"], field) == expected


def test_paths_and_names_keep_file_order() -> None:
    loaded = parsed(
        """\
        [services.zeta]
        command = "z"
        [services."alpha.1"]
        command = "a"
        [services]
        mid.command = "m"
        """
    )
    assert list(loaded.services) == ["zeta", "alpha.1", "mid"]
    assert loaded.order() == ["zeta", "alpha.1", "mid"]


# -- every mistake is one line, at its line and column ------------------------------------------

ERRORS = [
    # A service's keys, in a [services.NAME] table.
    (
        """\
        [services.web]
        command = "x"
        restart = "sometimes"
        """,
        "3:1: services.web.restart: 'sometimes' is not a restart policy "
        "(never, on-failure, always)",
    ),
    # The same key in an inline table: the column of the key inside it.
    (
        """\
        [services]
        db = { command = "y" }
        web = { command = "x", restart = "sometimes" }
        """,
        "3:24: services.web.restart: 'sometimes' is not a restart policy",
    ),
    # Dotted keys, at the top and under [services].
    (
        """\
        services.web.command = "x"
        services.web.grace = "forever"
        """,
        "2:14: services.web.grace: 'forever' is not a duration",
    ),
    (
        """\
        [services]
        web.command = "x"
        web.output_limit = "lots"
        """,
        "3:5: services.web.output_limit: 'lots' is not a size such as 512KiB",
    ),
    # Quoted keys.
    (
        """\
        [services."my-app"]
        command = "x"
        "stop_signal" = "SIGNOPE"
        """,
        "3:1: services.my-app.stop_signal: 'SIGNOPE' is not a signal name or number",
    ),
    (
        """\
        [services."my app"]
        command = "x"
        """,
        "1:11: services.\"my app\": 'my app' is not a service name: it has ' '",
    ),
    (
        """\
        [services.1web]
        command = "x"
        """,
        "1:11: services.1web: '1web' is not a service name: it must start with an ASCII letter",
    ),
    # Unknown keys, everywhere, naming the allowed ones.
    (
        """\
        [services.web]
        comand = "x"
        """,
        "2:1: services.web.comand: unknown key (did you mean 'command'?); allowed: command, cwd, "
        "depends_on, env, grace, labels, output_limit, port, ready, restart, stop_signal",
    ),
    (
        """\
        version = 2
        [services.web]
        command = "x"
        """,
        "1:1: version: unknown key; allowed: ports, services",
    ),
    (
        """\
        [services.web]
        command = "x"
        ready = { port = 80, timeout = "5s", retries = 3 }
        """,
        "3:38: services.web.ready.retries: unknown key; allowed: file, host, notify, output, "
        "port, timeout",
    ),
    (
        """\
        [services.web]
        command = "x"
        [services.web.restart]
        mode = "always"
        windw = "1m"
        """,
        "5:1: services.web.restart.windw: unknown key (did you mean 'window'?)",
    ),
    # A missing key is placed at what encloses it.
    (
        """\
        # the web front
        [services.web]
        cwd = "x"
        """,
        "2:11: services.web: has no command",
    ),
    ("", "1:1: services: no services"),
    ("[services]\n", "1:2: services: no services"),
    ('[ports]\nrange = "1-2"\n', "1:1: services: no services"),
    # Types, and values of the right type that mean nothing.
    (
        """\
        [services.web]
        command = ["python", 3]
        """,
        "2:22: services.web.command[1]: must be a string, not an integer",
    ),
    ('[services.web]\ncommand = ""\n', "2:1: services.web.command: is empty"),
    ("[services.web]\ncommand = []\n", "2:1: services.web.command: is empty"),
    ('[services.web]\ncommand = "a \'b"\n', '2:1: services.web.command: "a \'b" cannot be split'),
    ("[services.web]\ncommand = 3\n", "2:1: services.web.command: must be a command line or"),
    ('services.web = "x"\n', "1:10: services.web: must be a table of the service's keys"),
    ('services = ["x"]\n', "1:1: services: must be a table of services"),
    (
        """\
        [services.web]
        command = "x"
        env = { A = "1", B = { C = 1 } }
        """,
        "3:18: services.web.env.B: must be a string, number or boolean, not a table",
    ),
    (
        """\
        [services.web]
        command = "x"
        env.PORT = "80"
        port = 8080
        """,
        "3:5: services.web.env.PORT: is set by port: keep one of the two",
    ),
    (
        '[services.web]\ncommand = "x"\nlabels = { tier = 1 }\n',
        "3:12: services.web.labels.tier: must be a string, not an integer",
    ),
    (
        '[services.web]\ncommand = "x"\nready = { host = "h" }\n',
        "3:1: services.web.ready: needs a probe",
    ),
    (
        '[services.web]\ncommand = "x"\nready = { port = 70000 }\n',
        "3:11: services.web.ready.port: 70000 is out of range (1 to 65535)",
    ),
    (
        '[services.web]\ncommand = "x"\nready = { output = "(" }\n',
        "3:11: services.web.ready.output: '(' does not compile",
    ),
    (
        '[services.web]\ncommand = "x"\nready = { port = 80, timeout = "0s" }\n',
        "3:22: services.web.ready.timeout: must be more than 0",
    ),
    (
        '[services.web]\ncommand = "x"\nready.notify = "yes"\n',
        "3:7: services.web.ready.notify: must be true or false, not a string",
    ),
    (
        '[services.web]\ncommand = "x"\n'
        'restart = { backoff_initial = "10s", backoff_max = "1s" }\n',
        "3:38: services.web.restart.backoff_max: must be at least backoff_initial (10s)",
    ),
    (
        '[services.web]\ncommand = "x"\nrestart = { backoff_initial = "1m" }\n',
        "3:13: services.web.restart.backoff_initial: is more than backoff_max (30s by default)",
    ),
    (
        '[services.web]\ncommand = "x"\nrestart = { max_restarts = -1 }\n',
        "3:13: services.web.restart.max_restarts: -1 is not from 0 to",
    ),
    (
        '[services.web]\ncommand = "x"\nrestart = true\n',
        "3:1: services.web.restart: must be a policy (never, on-failure, always) or a table, "
        "not a boolean",
    ),
    ('[services.web]\ncommand = "x"\ngrace = "2d"\n', "3:1: services.web.grace: '2d' is longer"),
    ('[services.web]\ncommand = "x"\ngrace = -1\n', "3:1: services.web.grace: -1 is not a"),
    ('[services.web]\ncommand = "x"\noutput_limit = -1\n', "3:1: services.web.output_limit: -1"),
    ('[services.web]\ncommand = "x"\nport = 0\n', "3:1: services.web.port: 0 is out of range"),
    ('[services.web]\ncommand = "x"\nport = "any"\n', "3:1: services.web.port: 'any' is neither"),
    ('[services.web]\ncommand = "x"\ncwd = "~/x"\n', "3:1: services.web.cwd: '~/x': '~' is not"),
    # Dependencies: at the depends_on key.
    (
        """\
        [services.web]
        command = "x"
        depends_on = ["db", "cache"]
        [services.db]
        command = "y"
        """,
        "3:1: services.web.depends_on: 'cache' is not a service of this file (web, db)",
    ),
    (
        """\
        [services.db]
        command = "y"
        depends_on = ["web"]
        [services.web]
        command = "x"
        depends_on = ["db"]
        """,
        "3:1: services.db.depends_on: a cycle: db -> web -> db",
    ),
    (
        '[services.web]\ncommand = "x"\ndepends_on = ["web"]\n',
        "3:1: services.web.depends_on: a cycle: web -> web",
    ),
    (
        """\
        [services]
        a = { command = "a", depends_on = ["b"] }
        b = { command = "b", depends_on = ["c"] }
        c = { command = "c", depends_on = ["b"] }
        """,
        "3:22: services.b.depends_on: a cycle: b -> c -> b",
    ),
    (
        '[services.web]\ncommand = "x"\ndepends_on = ["db", "db"]\n[services.db]\ncommand = "y"\n',
        "3:1: services.web.depends_on: 'db' is listed twice",
    ),
    # The [ports] table.
    ('[ports]\nrange = "3000-2000"\n', "2:1: ports.range: '3000-2000' runs backwards"),
    ('[ports]\nrange = "3000"\n', "2:1: ports.range: '3000' is not a port range"),
    ('[ports]\nrange = "0-10"\n', "2:1: ports.range: 0 is out of range (1 to 65535)"),
    ("[ports]\nfrom = 1\n", "2:1: ports.from: unknown key; allowed: range"),
    # Syntax: tomllib's own place and words.
    ('[services.web]\ncommand = "x\n', "2:13: invalid TOML: illegal character"),
    ("[services.web]\ncommand\n", "2:8: invalid TOML: expected '=' after a key"),
    (
        '[services.web]\ncommand = "x"\ncommand = "y"\n',
        "3:14: invalid TOML: cannot overwrite a value",
    ),
    ("[services.web\n", "1:14: invalid TOML: expected ']' at the end of a table declaration"),
    ("[services]\nweb = { command = \n", "2:19: invalid TOML: invalid value"),
]


@pytest.mark.parametrize(("text", "expected"), ERRORS)
def test_every_mistake_is_one_line_naming_line_and_column(text: str, expected: str) -> None:
    error = refused(text)
    message = str(error).removeprefix("procledger.toml:")
    assert message.startswith(expected), message
    line, column = (int(number) for number in expected.split(":")[:2])
    assert (error.path, error.line, error.column) == ("procledger.toml", line, column)


def test_the_error_format_is_path_line_column_key_what() -> None:
    error = refused('[services.web]\ncommand = "x"\nrestart = "sometimes"\n')
    assert re.fullmatch(r"procledger\.toml:\d+:\d+: [\w.]+: .+", str(error))


def test_a_syntax_error_at_the_end_of_the_document_is_placed_there() -> None:
    error = refused('[services.web]\ncommand = """x\n')
    assert error.line is not None
    assert error.line >= 2


def test_signals_only_the_host_knows_need_its_table() -> None:
    text = '[services.w]\ncommand = "x"\nstop_signal = "USR1"\n'
    with pytest.raises(ServiceFileError, match="'USR1' is not a signal name or number"):
        parse_service_file(text, path="f.toml", base_dir=BASE)
    assert (
        parse_service_file(text, path="f", base_dir=BASE, signals={"SIGUSR1": 30})
        .services["w"]
        .stop_signal
        == 30
    )


def test_base_dir_must_be_absolute() -> None:
    with pytest.raises(ValueError, match="absolute"):
        parse_service_file('[services.w]\ncommand = "x"\n', path="f", base_dir="rel")


# -- where keys are written ---------------------------------------------------------------------


def test_key_places_follow_every_way_to_write_a_key() -> None:
    text = textwrap.dedent(
        """\
        # a comment with [brackets] and = signs
        [services.web]
        command = ["a", 'b', \"\"\"c
        d\"\"\"]   # after
        env.A = 1
        [services."my app"]
        x = { y = { z = 1 }, w = [ { v = 2 } ] }
        [[jobs]]
        k = 1
        [[jobs]]
        k = 2
        [jobs.sub]
        m = 1979-05-27 07:32:00Z
        """
    )
    places = KeyPlaces.of(text)
    assert places.find(("services", "web")) == (2, 11)
    assert places.find(("services", "web", "command", 2)) == (3, 22)
    assert places.find(("services", "web", "env", "A")) == (5, 5)
    assert places.find(("services", "my app", "x", "y", "z")) == (7, 13)
    assert places.find(("services", "my app", "x", "w", 0)) == (7, 28)
    assert places.find(("services", "my app", "x", "w", 0, "v")) == (7, 30)
    assert places.find(("jobs", 1, "k")) == (11, 1)
    assert places.find(("jobs", 1, "sub", "m")) == (13, 1)
    assert places.find(("services", "web", "nothing", "here")) == (2, 11)
    assert places.find(("nowhere",)) == (1, 1)


TOMLISH = st.text(alphabet=st.sampled_from(list("[]{}=,.#\"'\\ \n\tab1-_")), max_size=60)


@given(TOMLISH)
def test_key_places_end_on_any_text(text: str) -> None:
    """Only text tomllib accepted is scanned, but a scanner that loops or raises on a
    construct it does not know must still place the error somewhere."""
    places = KeyPlaces.of(text)
    for path in places.offsets:
        line, column = places.find(path)
        assert 1 <= line <= text.count("\n") + 1
        assert column >= 1


KEYS = st.sampled_from(["a", "b", "web", "1x", "my app", "x.y", 'q"z', "ü", "=", ""])
TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=3)
"""What ``json.dumps`` writes as a valid TOML string (TOML refuses control characters raw)."""
LEAVES = st.one_of(st.integers(-5, 5), TEXT, st.lists(st.integers(0, 9), max_size=3))
TREES = st.recursive(
    LEAVES, lambda inner: st.dictionaries(KEYS, inner, max_size=3), max_leaves=12
).filter(lambda tree: isinstance(tree, dict))


def toml_key(key: str, literal: bool) -> str:
    if re.fullmatch(r"[A-Za-z0-9_-]+", key):
        return key
    if literal and "'" not in key:
        return f"'{key}'"
    return json.dumps(key, ensure_ascii=False)


def inline(value: object, data: st.DataObject) -> str:
    if isinstance(value, dict):
        pairs = (
            f"{toml_key(k, data.draw(st.booleans()))} = {inline(v, data)}" for k, v in value.items()
        )
        return "{ " + ", ".join(pairs) + " }" if value else "{}"
    if isinstance(value, list):
        return "[\n  " + ",\n  ".join(inline(item, data) for item in value) + "  # x\n]"
    return json.dumps(value, ensure_ascii=False)


def write_table(tree: dict, prefix: list[str], data: st.DataObject, lines: list[str]) -> None:
    """``tree``'s keys under the header ``prefix``, each sub-table inline, dotted or under a
    header of its own (after the others, as TOML requires)."""
    later = []
    for key, value in tree.items():
        written_key = toml_key(key, data.draw(st.booleans()))
        style = data.draw(st.sampled_from(["inline", "dotted", "header"]))
        if isinstance(value, dict) and value and style == "header":
            later.append((key, value))
        elif isinstance(value, dict) and value and style == "dotted" and _plain(value):
            for sub, leaf in value.items():
                lines.append(f"{written_key} . {toml_key(sub, False)} = {inline(leaf, data)}")
        else:
            lines.append(f"{written_key} = {inline(value, data)}")
    for key, value in later:
        path = [*prefix, toml_key(key, data.draw(st.booleans()))]
        lines.append(f"[ {'.'.join(path)} ]  # table")
        write_table(value, path, data, lines)


def _plain(tree: dict) -> bool:
    return all(not isinstance(value, dict) for value in tree.values())


def key_paths(tree: object, prefix: tuple = ()) -> list[tuple[tuple, object]]:
    found: list[tuple[tuple, object]] = []
    items = (
        tree.items()
        if isinstance(tree, dict)
        else enumerate(tree)
        if isinstance(tree, list)
        else ()
    )
    for key, value in items:
        found.append(((*prefix, key), value))
        found += key_paths(value, (*prefix, key))
    return found


@given(TREES, st.data())
def test_key_places_find_every_key_however_it_is_written(tree: dict, data: st.DataObject) -> None:
    lines: list[str] = []
    write_table(tree, [], data, lines)
    text = "\n".join(lines) + "\n"
    assert tomllib.loads(text) == tree
    places = KeyPlaces.of(text)
    for path, _ in key_paths(tree):
        assert path in places.offsets, (path, text)
        offset = places.offsets[path]
        last = path[-1]
        if isinstance(last, str):
            assert text[offset:].startswith((toml_key(last, True), toml_key(last, False))), path


# -- orders -------------------------------------------------------------------------------------

FOUR = """\
[services.web]
command = "w"
depends_on = ["db", "cache"]
[services.worker]
command = "k"
depends_on = ["db"]
[services.db]
command = "d"
[services.cache]
command = "c"
[services.lone]
command = "l"
"""


def test_order_puts_dependencies_first_and_ties_in_file_order() -> None:
    loaded = parsed(FOUR)
    assert loaded.order() == ["db", "worker", "cache", "web", "lone"]
    assert loaded.order(["web"]) == ["db", "cache", "web"]
    assert loaded.order(["worker", "lone"]) == ["db", "worker", "lone"]
    assert loaded.dependents_first() == ["lone", "web", "cache", "worker", "db"]
    assert loaded.dependents_first(["db"]) == ["web", "worker", "db"]
    assert loaded.dependents_first(["cache"]) == ["web", "cache"]


def test_an_unknown_name_is_an_option_error_listing_the_services() -> None:
    loaded = parsed(FOUR)
    for order in (loaded.order, loaded.dependents_first):
        with pytest.raises(OptionError) as caught:
            order(["web", "nope"])
        assert caught.value.option == "NAME"
        assert str(caught.value) == (
            "NAME: no service 'nope' in procledger.toml (web, worker, db, cache, lone)"
        )


@st.composite
def dags(draw: st.DrawFn) -> tuple[list[str], dict[str, list[str]]]:
    """Services in file order, each depending on some of the others that come earlier in a
    hidden topological order (so no cycle), written in a shuffled file order."""
    count = draw(st.integers(min_value=1, max_value=12))
    topological = [f"s{index}" for index in range(count)]
    needs = {
        name: draw(st.lists(st.sampled_from(topological[:index]), unique=True)) if index else []
        for index, name in enumerate(topological)
    }
    return draw(st.permutations(topological)), needs


def written(file_order: list[str], needs: dict[str, list[str]], style: int) -> str:
    """The same services as TOML, in one of three styles."""
    lines = ["[services]"] if style == 1 else []
    for name in file_order:
        depends = ", ".join(f'"{need}"' for need in needs[name])
        if style == 0:
            lines += [f"[services.{name}]", f'command = "run {name}"', f"depends_on = [{depends}]"]
        elif style == 1:
            lines.append(f'{name} = {{ command = "run {name}", depends_on = [{depends}] }}')
        else:
            lines += [f'services.{name}.command = "run {name}"']
            lines += [f"services.{name}.depends_on = [{depends}]"]
    return "\n".join(lines) + "\n"


@given(dags(), st.integers(min_value=0, max_value=2), st.data())
def test_order_respects_every_dependency_of_any_dag(
    dag: tuple[list[str], dict[str, list[str]]], style: int, data: st.DataObject
) -> None:
    file_order, needs = dag
    loaded = parsed(written(file_order, needs, style))
    assert list(loaded.services) == file_order
    everything = loaded.order()
    assert sorted(everything) == sorted(file_order)
    for name in file_order:
        assert all(everything.index(need) < everything.index(name) for need in needs[name])
    assert loaded.dependents_first() == everything[::-1]
    chosen = data.draw(st.lists(st.sampled_from(file_order), max_size=3))
    some = loaded.order(chosen)
    assert some == [name for name in everything if name in some]
    reached = set(chosen)
    while grown := {need for name in reached for need in needs[name]} - reached:
        reached |= grown
    assert set(some) == reached
    stopping = loaded.dependents_first(chosen)
    assert stopping == [name for name in everything[::-1] if name in stopping]
    assert set(chosen) <= set(stopping)
    for name in file_order:
        if set(needs[name]) & set(stopping):
            assert name in stopping


@given(dags())
def test_a_cycle_is_always_found(dag: tuple[list[str], dict[str, list[str]]]) -> None:
    file_order, needs = dag
    first = file_order[0]
    if file_order[-1] not in needs[first]:
        needs = {**needs, first: [*needs[first], file_order[-1]]}
    if file_order[-1] == first or first in _reachable(needs, file_order[-1]):
        error = refused(written(file_order, needs, 0))
        assert "a cycle: " in str(error)
        cycle = str(error).split("a cycle: ")[1].split(" -> ")
        assert cycle[0] == cycle[-1]
        assert all(b in needs[a] for a, b in itertools.pairwise(cycle))
    else:
        parsed(written(file_order, needs, 0))


def _reachable(needs: dict[str, list[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        for need in needs[name]:
            if need not in seen:
                seen.add(need)
                todo.append(need)
    return seen


# -- the digest ---------------------------------------------------------------------------------

AS_HEADER = """\
[services.web]
command = ["python", "-m", "http.server", "8000"]
env = { A = "1", B = "2" }
restart = { mode = "always", window = "1m" }
depends_on = ["db"]
[services.db]
command = "db"
"""
AS_INLINE = """\
[services]
db = { command = "db" }
web = { command = ["python", "-m", "http.server", "8000"], env = { B = 2, A = 1 }, restart = { window = 60, mode = "always" }, depends_on = ["db"] }
"""  # noqa: E501
AS_DOTTED = """\
# dotted keys, in another order
services.web.restart.window = "60s"
services.web.env.B = "2"
services.db.command = ["db"]
services.web.restart.mode = "always"
services.web.command = ['python', '-m', 'http.server', '8000']
services.web.env.A = "1"
services.web.depends_on = ["db"]
"""


def test_the_digest_follows_the_definition_not_the_writing() -> None:
    digests = {parsed(text).services["web"].digest() for text in (AS_HEADER, AS_INLINE, AS_DOTTED)}
    assert len(digests) == 1
    (digest,) = digests
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest)
    assert parsed(AS_HEADER).services["web"] == parsed(AS_DOTTED).services["web"]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('"8000"]', '"8001"]'),
        ('A = "1"', 'A = "0"'),
        ('window = "1m"', 'window = "2m"'),
        ('depends_on = ["db"]', 'depends_on = ["db"]\ngrace = 3'),
        ('depends_on = ["db"]', 'depends_on = ["db"]\nlabels = { x = "y" }'),
        ('depends_on = ["db"]', 'depends_on = ["db"]\nport = "auto"'),
        ('depends_on = ["db"]', 'depends_on = ["db"]\nstop_signal = "KILL"'),
        ('depends_on = ["db"]', 'depends_on = ["db"]\ncwd = "sub"'),
        ('depends_on = ["db"]', 'depends_on = ["db"]\noutput_limit = 1'),
        ('depends_on = ["db"]', 'depends_on = ["db"]\nready.file = "f"'),
    ],
)
def test_the_digest_changes_with_what_runs(old: str, new: str) -> None:
    assert old in AS_HEADER
    before = parsed(AS_HEADER).services["web"].digest()
    assert parsed(AS_HEADER.replace(old, new)).services["web"].digest() != before


def test_the_digest_ignores_the_order_of_start() -> None:
    without = AS_HEADER.replace('depends_on = ["db"]\n', "")
    assert parsed(without).services["web"].digest() == parsed(AS_HEADER).services["web"].digest()


def test_a_file_built_by_hand_is_checked_too() -> None:
    web = ServiceDefinition(name="web", command=("x",), cwd="/", depends_on=("db",))
    with pytest.raises(ValueError, match="'db' is not a service"):
        ServiceFile(path="f", services={"web": web})
    with pytest.raises(ValueError, match="defined with the name"):
        ServiceFile(path="f", services={"other": web.model_copy(update={"depends_on": ()})})
    with pytest.raises(ValueError, match="out of range"):
        ServiceDefinition(name="web", command=("x",), cwd="/", port=0)


# -- the grammars shared with run, and service names ---------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [("0", 0), ("512KiB", 524288), ("1MiB", 1048576), ("64mib", 64 << 20), ("2 G", 2 << 30),
     ("7B", 7), (" 10k ", 10240), (4096, 4096)],
)  # fmt: skip
def test_sizes(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "1.5MiB", "-1", "١٢", "9" * 40, "1TiB", -1, True, 2**64])
def test_sizes_refused_name_the_option(text: str | int) -> None:
    with pytest.raises(OptionError) as caught:
        parse_size(text, option="output_limit")
    assert caught.value.option == "output_limit"


@pytest.mark.parametrize(
    ("text", "number"),
    [("TERM", 15), ("SIGTERM", 15), ("sigkill", 9), (" hup ", 1), ("15", 15), (2, 2)],
)
def test_signals(text: str | int, number: int) -> None:
    assert parse_signal(text) == number


@pytest.mark.parametrize("text", ["", "NOPE", "0", "99", "-15", "²", "9" * 5000, True, 10])
def test_signals_refused_name_the_option(text: str | int) -> None:
    with pytest.raises(OptionError, match="is not a signal name or number") as caught:
        parse_signal(text, option="stop_signal")
    assert caught.value.option == "stop_signal"


@pytest.mark.parametrize("name", ["web", "a", "W3b_2", "db.primary", "x-y", "a" * 63, "a_"])
def test_service_names(name: str) -> None:
    assert check_service_name(name) == name
    assert SERVICE_NAME.fullmatch(name)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("", "cannot be empty"),
        ("a" * 64, "longer than 63"),
        ("1web", "must start with an ASCII letter"),
        (":web", "must start with an ASCII letter"),
        ("_web", "must start with an ASCII letter"),
        ("wéb", "has 'é'"),
        ("we b", "has ' '"),
        ("web.", "must not end with '.' or '-'"),
        ("web-", "must not end with '.' or '-'"),
        ("\u212aelvin", "must start with an ASCII letter"),
    ],
)
def test_names_refused_say_why_and_name_the_option(name: str, why: str) -> None:
    with pytest.raises(OptionError, match=re.escape(why)) as caught:
        check_service_name(name, option="NAME")
    assert caught.value.option == "NAME"
    assert not SERVICE_NAME.fullmatch(name)


@given(st.text(max_size=70))
def test_the_pattern_and_the_checker_agree(name: str) -> None:
    try:
        check_service_name(name)
    except OptionError:
        assert not SERVICE_NAME.fullmatch(name)
    else:
        assert SERVICE_NAME.fullmatch(name)
