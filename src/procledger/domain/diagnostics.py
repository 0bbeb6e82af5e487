"""The one rule for fitting a diagnostic into a record.

A record keeps at most ``MAX_DIAGNOSTIC_BYTES`` of diagnostic (UTF-8), whoever writes it: the
Supervisor after a spawn or output failure, recovery after a runner raised. Both clip the same
way, so a reader can always tell a clipped diagnostic (it ends with ``CLIP_MARKER``) from one
that merely happens to be long.
"""

from __future__ import annotations

from typing import Final

from procledger.domain.records import MAX_DIAGNOSTIC_BYTES

__all__ = ["CLIP_MARKER", "clip_diagnostic"]

CLIP_MARKER: Final = "…"
"""Ends every clipped diagnostic: one character, three UTF-8 bytes."""

_MARKER_BYTES: Final = len(CLIP_MARKER.encode())


def clip_diagnostic(text: str) -> str:
    """``text`` as a record can hold it: at most ``MAX_DIAGNOSTIC_BYTES`` UTF-8 bytes.

    Short text comes back unchanged. Longer text is cut on a character boundary and ends with
    ``CLIP_MARKER``, the whole still within the limit. A lone surrogate (a file name decoded
    with ``surrogateescape``, say) cannot be stored as UTF-8, so it becomes ``?`` rather than
    failing the terminal write that carries it.
    """
    data = text.encode("utf-8", "replace")
    if len(data) <= MAX_DIAGNOSTIC_BYTES:
        return data.decode()
    kept = data[: MAX_DIAGNOSTIC_BYTES - _MARKER_BYTES].decode("utf-8", "ignore")
    return kept + CLIP_MARKER
