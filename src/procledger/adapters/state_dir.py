"""The user's state directory: where procledger keeps what belongs to this user on this host
and must survive a crash of the program that wrote it (the outbox, docs/design.md §6.3).

``$XDG_STATE_HOME/procledger`` when ``XDG_STATE_HOME`` is an absolute path (the XDG base
directory rule: a relative one is ignored), else ``~/.local/state/procledger``. The folder is
created ``0700``: what it holds (exit codes, diagnostics, owners) is nobody else's business.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["state_dir", "subdirectory"]


def state_dir(environ: os._Environ[str] | dict[str, str] | None = None) -> Path:
    """The state directory's path (not created): see the module docstring."""
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_STATE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "state"
    return base / "procledger"


def subdirectory(name: str, environ: os._Environ[str] | dict[str, str] | None = None) -> Path:
    """``state_dir() / name``, created ``0700`` with its parents where missing.

    Raises:
        OSError: the folder cannot be created (the caller decides what that costs).
    """
    env = os.environ if environ is None else environ
    key = (name, env.get("XDG_STATE_HOME"), env.get("HOME"))
    made = _MADE.get(key)
    if made is not None and os.path.isdir(made):  # one stat, not two mkdirs and a chmod
        return made
    root = state_dir(environ)
    root.parent.mkdir(parents=True, exist_ok=True)
    for folder in (root, root / name):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(folder, 0o700)  # mkdir's mode is masked by the umask
    _MADE[key] = made = root / name
    return made


_MADE: dict[tuple[str, str | None, str | None], Path] = {}
"""Folders this process made (or found) already: each supervised run asks for its output
root again, and a folder removed since is made again."""
