"""Environment values encrypted at rest (docs/design.md §13.4).

With ``PROCLEDGER_CIPHER_KEY`` set — 32 random bytes in URL-safe base64, as ``procledger
keygen`` prints — the env store keeps each environment as AES-GCM ciphertext under a fresh
96-bit nonce, authenticated together with its env ref, so a row copied under another ref does
not decrypt. The env ref stays the content hash of the plaintext: deduplication and
registration hashes do not depend on the key. A row written without a key is plain JSON and
stays readable with or without one.

The key is read from the environment at each use (a long-running program picks up a key set
later), and ``cryptography`` is imported only when a key is set or an encrypted row is read.
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
from typing import Any

from procledger.domain.errors import CipherError, StoreCorrupt

KEY_VARIABLE = "PROCLEDGER_CIPHER_KEY"
PREFIX = "aesgcm:v1:"
"""How an encrypted row begins; plain rows are JSON objects and begin with ``{``."""
_NONCE_BYTES = 12


def new_key() -> str:
    """A fresh key for ``PROCLEDGER_CIPHER_KEY``: 32 random bytes, URL-safe base64."""
    return base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()


def configured_key(what: str) -> bytes | None:
    """The key ``PROCLEDGER_CIPHER_KEY`` holds, or ``None`` when it is unset or empty.

    Raises:
        CipherError: it is not 32 bytes of URL-safe base64 (``what`` names the env ref).
    """
    text = os.environ.get(KEY_VARIABLE, "").strip()
    if not text:
        return None
    try:
        key = base64.urlsafe_b64decode(text.encode("ascii") + b"=" * (-len(text) % 4))
    except (binascii.Error, ValueError, UnicodeEncodeError):
        key = b""
    if len(key) != 32:
        raise CipherError(f"{what}: ${KEY_VARIABLE} is not 32 bytes of URL-safe base64")
    return key


def is_encrypted(stored: str) -> bool:
    return stored.startswith(PREFIX)


def seal(env_ref: str, plaintext: bytes) -> str | None:
    """``plaintext`` encrypted for the row of ``env_ref``, or ``None`` without a key."""
    key = configured_key(f"environment {env_ref!r}")
    if key is None:
        return None
    nonce = secrets.token_bytes(_NONCE_BYTES)
    sealed = _aead(key).encrypt(nonce, plaintext, env_ref.encode())
    return PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode()


def unseal(env_ref: str, stored: str) -> bytes:
    """The plaintext of an encrypted row.

    Raises:
        CipherError: no key is set, or it is not the key the row was encrypted with, naming
            the env ref.
    """
    what = f"environment {env_ref!r}"
    key = configured_key(what)
    if key is None:
        raise CipherError(f"{what} is encrypted and ${KEY_VARIABLE} is not set")
    from cryptography.exceptions import InvalidTag  # noqa: PLC0415 - start-up time

    try:
        raw = base64.urlsafe_b64decode(stored[len(PREFIX) :].encode("ascii"))
        return bytes(_aead(key).decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], env_ref.encode()))
    except InvalidTag:
        raise CipherError(
            f"{what} cannot be decrypted: ${KEY_VARIABLE} is not the key it was encrypted "
            "with (or the row was altered)"
        ) from None
    except (binascii.Error, ValueError, UnicodeEncodeError) as error:
        raise StoreCorrupt(f"{what}: the encrypted row is malformed ({error})") from None


def _aead(key: bytes) -> Any:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: PLC0415 - start-up

    return AESGCM(key)
