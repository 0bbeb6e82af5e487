"""What a person reads when a command fails: one sentence naming the thing at fault -- the
command that could not run, the file, the process, the store -- never a Python class name
(docs/design.md §8).

``error_sentence`` is the one function that turns an exception into that sentence; the CLI's
error line is ``procledger COMMAND: <sentence>``. This module imports the standard library
only: a command path that must not load typer or pydantic calls it too. It therefore knows
procledger's errors by the names in their class hierarchy, not by importing them.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil

__all__ = ["error_sentence", "plain"]

_QUOTED = r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\""
_ERRNO = re.compile(r"^\[Errno -?\d+\] ")
_SPAWN = re.compile(
    rf"^cannot start command (?P<command>{_QUOTED})"
    rf"(?: in directory (?P<directory>{_QUOTED}))?: (?P<reason>.*)$",
    re.DOTALL,
)
_REASON = re.compile(rf"^(?P<why>.*?)(?:: (?:\w*Path\()?(?P<file>{_QUOTED})\)?)?$", re.DOTALL)
"""The OS's reason, and the file it names: a ``repr``, of a ``Path`` where one was given."""
_PYDANTIC = (
    (re.compile(r"\b(?:Value error|Assertion failed), "), ""),
    (re.compile(r", unable to parse string as an? (?:integer|number)"), ""),
    (re.compile(r"\bInput should be a valid integer\b"), "must be a whole number"),
    (re.compile(r"\bInput should be less than or equal to\b"), "must be at most"),
    (re.compile(r"\bInput should be greater than or equal to\b"), "must be at least"),
    (re.compile(r"\bInput should be greater than\b"), "must be more than"),
    (re.compile(r"\bInput should be\b"), "must be"),
)


def error_sentence(exc: BaseException) -> str:
    """``exc`` as one sentence for a person, on one line: ``cannot run 'nosuchprog': no such
    file or directory``, ``process 'abc' not found (no id starts with it)``, ``'/x': permission
    denied``. A procledger error says what its message says (its messages name their culprit);
    an ``OSError`` says which file and why, without ``[Errno N]``; an exception procledger did
    not expect keeps its class name, as ``internal error (TypeError): ...``, for a bug report."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if "SpawnError" in names:
        text = spawn_sentence(_os_message(exc))
    elif "AgentError" in names:
        text = _agent_sentence(exc)
    elif "ProcledgerError" in names:
        text = str(exc) or _words(type(exc).__name__)
    elif isinstance(exc, OSError):
        text = _os_sentence(exc)
    elif isinstance(exc, KeyboardInterrupt):
        text = "interrupted"
    elif "ValidationError" in names and callable(getattr(exc, "errors", None)):
        text = _validation_sentence(exc)
    else:
        text = f"internal error ({type(exc).__name__}): {exc}".rstrip(": ")
    return plain(text) or _words(type(exc).__name__)


def plain(text: str) -> str:
    """``text`` on one line, with what pydantic's messages put in for a programmer (``Value
    error, ``; ``Input should be a valid integer, unable to parse string as an integer``) said
    as a person would (``must be a whole number``). The CLI's usage lines pass through here too:
    typer checks an option's type with pydantic."""
    for pattern, replacement in _PYDANTIC:
        text = pattern.sub(replacement, text)
    return " ".join(text.split())


def spawn_sentence(message: str) -> str:
    """A ``SpawnError``'s message (``cannot start command 'prog args' in directory 'D': No
    such file or directory: 'prog'``) as ``cannot run 'prog': no such file or directory``. The
    directory is named only where it matters: a relative path (``./x``) is looked up in it, or
    it is what is missing. A message of another shape is kept as it is."""
    found = _SPAWN.match(_ERRNO.sub("", message))
    if found is None:
        return _ERRNO.sub("", message)
    command = _literal(found["command"])
    try:
        program = shlex.split(command)[0]
    except (ValueError, IndexError):
        program = command
    directory = _literal(found["directory"]) if found["directory"] else None
    reason = _REASON.match(found["reason"])
    why = _lower_first(reason["why"]) if reason else found["reason"]
    file = _literal(reason["file"]) if reason and reason["file"] else None
    relative = "/" in program and not program.startswith("/")
    where = f" in {directory!r}" if directory and (relative or file == directory) else ""
    named = f": {file!r}" if file not in (None, program, directory) else ""
    if why == "no such file or directory" and file != directory:
        interpreter = _missing_interpreter(program, directory)
        if interpreter is not None:  # the script is there: what is missing is on its #! line
            why, named = f"its interpreter {interpreter!r} (the #! line) is not there", ""
    return f"cannot run {program!r}{where}: {why}{named}"


def _missing_interpreter(program: str, directory: str | None) -> str | None:
    """The interpreter a script's ``#!`` line names, when the script itself is there: exec
    then fails with "no such file or directory" for a file a person can see (a line ending
    in ``\\r``, written on Windows, is the classic case)."""
    path = os.path.join(directory or os.getcwd(), program) if "/" in program else None
    path = path or shutil.which(program)
    try:
        with open(path or "", "rb") as script:
            first = script.readline(4096)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].rstrip(b"\n").split(b" ")
    named = next((word for word in words if word.strip(b" \t")), b"")
    return os.fsdecode(named) if named else None


def _os_message(exc: BaseException) -> str:
    """An ``OSError``'s own words, without the ``[Errno N]`` its ``str`` puts first."""
    strerror = getattr(exc, "strerror", None)
    return strerror if isinstance(strerror, str) and strerror else str(exc)


def _os_sentence(exc: OSError) -> str:
    """``'/path': permission denied`` (both paths of a rename), else the error's words."""
    why = _lower_first(_os_message(exc)) or _words(type(exc).__name__)
    if exc.filename is None:
        return _ERRNO.sub("", why)
    paths = repr(exc.filename) + ("" if exc.filename2 is None else f" -> {exc.filename2!r}")
    return f"{paths}: {why}"


def _agent_sentence(exc: BaseException) -> str:
    """The host agent's error reply: its message (a start it could not spawn, as a spawn)."""
    kind, message = getattr(exc, "type", ""), getattr(exc, "message", None)
    if not isinstance(message, str):
        return str(exc)
    if kind == "SpawnError":
        return spawn_sentence(message)
    return f"the host agent answered: {message}" if message else str(exc)


def _validation_sentence(exc: BaseException) -> str:
    """pydantic's ``ValidationError``: the first problem, naming the field."""
    errors = exc.errors()  # type: ignore[attr-defined]
    if not errors:
        return str(exc)
    first = errors[0]
    where = ".".join(str(part) for part in first.get("loc", ())) or "value"
    return f"invalid {where}: {first.get('msg', exc)}"


def _literal(quoted: str) -> str:
    """The text a Python string literal (a ``repr``) stands for."""
    import ast  # only when an error is being said: not on every command's start

    try:
        value = ast.literal_eval(quoted)
    except (ValueError, SyntaxError):
        return quoted
    return value if isinstance(value, str) else quoted


def _lower_first(text: str) -> str:
    """``No such file`` -> ``no such file``, but ``SIGPIPE ...`` or ``PATH ...`` stay."""
    if text[:1].isupper() and not text[1:2].isupper():
        return text[:1].lower() + text[1:]
    return text


def _words(name: str) -> str:
    """A class name as words, for an error with no message: ``LeaseLost`` -> ``lease lost``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name).lower()
