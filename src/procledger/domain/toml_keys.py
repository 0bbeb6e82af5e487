"""Where each key of a TOML document is written, so that an error about a value can name its
line and column (``procledger.toml:7:11: ...``), as a compiler's would.

``tomllib`` gives values without positions. ``KeyPlaces`` reads the text once more, after
``tomllib`` accepted it, and notes where every key path is first written: a ``[table.header]``,
a dotted key (``web.command = ...``), a key inside an inline table (``{ restart = "x" }``), a
quoted key (``[services."my-app"]``), an element of an array (its index is part of the path),
an ``[[array.of.tables]]`` (the index of each). A path that is not written anywhere -- a
required key that is missing -- is placed at the nearest enclosing key that is, and at worst at
line 1, column 1: an error always has a place. Columns count characters from 1, as
``tomllib``'s own messages do.
"""

from __future__ import annotations

import contextlib
import re
import tomllib
from dataclasses import dataclass, field
from typing import Final

__all__ = ["KeyPath", "KeyPlaces", "line_column"]

KeyPath = tuple[str | int, ...]
"""Keys from the document's root down, with an ``int`` for an array's element."""

_BARE_KEY: Final = re.compile(r"[^\s.=\[\]\"'#,{}]+")
"""A bare key, generously: the text was valid TOML, so whatever stops here is a delimiter."""
_SCALAR: Final = re.compile(r"[^,\]}\n#]*")
"""A number, boolean or date (``1979-05-27 07:32:00`` holds a space): up to a delimiter."""
_BLANK: Final = frozenset(" \t\r")


class _Stop(Exception):
    """The text is not what the scanner expected: keep the places found so far."""


def line_column(text: str, offset: int) -> tuple[int, int]:
    """The line and column (both from 1) of the character at ``offset``, as ``tomllib``
    counts them (a column counts characters, not bytes)."""
    offset = max(0, min(offset, len(text)))
    line = text.count("\n", 0, offset) + 1
    return line, offset - text.rfind("\n", 0, offset)


@dataclass
class KeyPlaces:
    """The offset in ``text`` where each key path is first written."""

    text: str
    offsets: dict[KeyPath, int] = field(default_factory=dict)

    @classmethod
    def of(cls, text: str) -> KeyPlaces:
        """Every key path of ``text`` (which ``tomllib`` parsed), with where it is written."""
        scanner = _Scanner(text)
        # A construct not foreseen stops the scan: what was found still places most errors.
        with contextlib.suppress(_Stop, IndexError, ValueError, tomllib.TOMLDecodeError):
            scanner.document()
        return cls(text, scanner.offsets)

    def find(self, path: KeyPath) -> tuple[int, int]:
        """The line and column of ``path``, else of its nearest enclosing key that is written,
        else (1, 1)."""
        for length in range(len(path), 0, -1):
            offset = self.offsets.get(path[:length])
            if offset is not None:
                return line_column(self.text, offset)
        return 1, 1


class _Scanner:
    """One pass over valid TOML, recording keys and skipping values."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.offsets: dict[KeyPath, int] = {}
        self.table: KeyPath = ()
        self.arrays: dict[KeyPath, int] = {}
        """How many elements each ``[[array of tables]]`` has so far."""

    def document(self) -> None:
        while True:
            self.skip_blank(lines=True)
            if self.pos >= len(self.text):
                return
            start = self.pos
            if self.text[self.pos] == "[":
                self.header()
            else:
                self.key_value(self.table)
            self.moved_from(start)

    def header(self) -> None:
        """``[a.b]`` or ``[[a.b]]``: the table the next keys belong to."""
        array = self.text.startswith("[[", self.pos)
        self.pos += 2 if array else 1
        keys = self.key()
        self.pos += 2 if array else 1
        path: KeyPath = ()
        for number, (key, offset) in enumerate(keys):
            path = (*path, key)
            if number < len(keys) - 1 and path in self.arrays:
                path = (*path, self.arrays[path] - 1)  # a prefix names its array's last table
            self.offsets.setdefault(path, offset)
        if array:
            index = self.arrays.get(path, 0)
            self.arrays[path] = index + 1
            path = (*path, index)
            self.offsets.setdefault(path, keys[-1][1])
        self.table = path

    def key_value(self, table: KeyPath) -> None:
        """``a.b = value``, its keys relative to ``table``."""
        path = table
        for key, offset in self.key():
            path = (*path, key)
            self.offsets.setdefault(path, offset)
        if self.text[self.pos] != "=":
            raise _Stop
        self.pos += 1
        self.skip_blank(lines=False)
        self.value(path)

    def key(self) -> list[tuple[str, int]]:
        """A dotted key: each part with its offset."""
        keys = []
        while True:
            self.skip_blank(lines=False)
            start = self.pos
            keys.append((self.key_part(), start))
            self.skip_blank(lines=False)
            if self.text[self.pos] != ".":
                return keys
            self.pos += 1

    def key_part(self) -> str:
        start = self.pos
        quote = self.text[start]
        if quote == '"':
            self.basic_string()
            value: str = tomllib.loads(f"k = {self.text[start : self.pos]}")["k"]
            return value
        if quote == "'":
            self.literal_string()
            return self.text[start + 1 : self.pos - 1]
        found = _BARE_KEY.match(self.text, start)
        if found is None:
            raise _Stop
        self.pos = found.end()
        return found.group()

    def value(self, path: KeyPath) -> None:
        text, pos = self.text, self.pos
        if text.startswith('"""', pos):
            self.multiline_string('"""')
        elif text.startswith("'''", pos):
            self.multiline_string("'''")
        elif text[pos] == '"':
            self.basic_string()
        elif text[pos] == "'":
            self.literal_string()
        elif text[pos] == "[":
            self.array(path)
        elif text[pos] == "{":
            self.inline_table(path)
        else:
            found = _SCALAR.match(text, pos)
            self.pos = found.end() if found else len(text)

    def array(self, path: KeyPath) -> None:
        self.pos += 1
        index = 0
        while True:
            self.skip_blank(lines=True)
            if self.text[self.pos] == "]":
                self.pos += 1
                return
            start = self.pos
            self.offsets.setdefault((*path, index), self.pos)
            self.value((*path, index))
            index += 1
            self.skip_blank(lines=True)
            if self.text[self.pos] == ",":
                self.pos += 1
            self.moved_from(start)

    def inline_table(self, path: KeyPath) -> None:
        self.pos += 1
        while True:
            self.skip_blank(lines=True)
            if self.text[self.pos] == "}":
                self.pos += 1
                return
            start = self.pos
            self.key_value(path)
            self.skip_blank(lines=True)
            if self.text[self.pos] == ",":
                self.pos += 1
            self.moved_from(start)

    def moved_from(self, start: int) -> None:
        """A loop's turn that read nothing would turn for ever: stop instead (only text
        ``tomllib`` refused, or a construct this scanner does not know, gets here)."""
        if self.pos <= start:
            raise _Stop

    def basic_string(self) -> None:
        """``"..."``, whose backslash escapes a quote."""
        self.pos += 1
        while self.text[self.pos] != '"':
            self.pos += 2 if self.text[self.pos] == "\\" else 1
        self.pos += 1

    def literal_string(self) -> None:
        self.pos = self.text.index("'", self.pos + 1) + 1

    def multiline_string(self, quotes: str) -> None:
        """``\"\"\"...\"\"\"`` or ``'''...'''``; up to two more quotes at the end are content."""
        self.pos += 3
        while not self.text.startswith(quotes, self.pos):
            escaped = quotes == '"""' and self.text[self.pos] == "\\"
            self.pos += 2 if escaped else 1
            if self.pos >= len(self.text):
                raise _Stop
        self.pos += 3
        for _ in range(2):
            if self.text.startswith(quotes[0], self.pos):
                self.pos += 1

    def skip_blank(self, *, lines: bool) -> None:
        """Spaces and tabs; with ``lines``, newlines and comments too. A comment ends a line,
        so after a value the next call (with ``lines``) moves past it."""
        text = self.text
        while self.pos < len(text):
            char = text[self.pos]
            if char in _BLANK or (lines and char == "\n"):
                self.pos += 1
            elif char == "#":
                end = text.find("\n", self.pos)
                self.pos = len(text) if end < 0 else end
            else:
                return
