"""`procledger keygen`: a new key for encrypting environment values at rest (docs/design.md §8).

The key is 32 random bytes from the OS's cryptographic source, URL-safe base64 encoded: the
form ``$PROCLEDGER_CIPHER_KEY`` takes. Nothing is stored; no ledger is opened.
"""

from __future__ import annotations

import sys


def keygen() -> None:
    """Print a new PROCLEDGER_CIPHER_KEY.

    32 random bytes, URL-safe base64. With it set, the
    values of an explicitly given environment are encrypted at rest; keep it safe -- without
    it they cannot be read back."""
    import base64
    import secrets

    key = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()
    sys.stdout.write(key + "\n")
