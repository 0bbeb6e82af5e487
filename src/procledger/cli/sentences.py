"""An exception as the sentence of the error line (placeholder until the sentence rules land)."""

from __future__ import annotations


def error_sentence(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
