"""Environment values at rest (docs/design.md §13.4): with ``PROCLEDGER_CIPHER_KEY`` set they are
AES-GCM ciphertext in the row, unreadable without the key (a clear error naming the env ref,
never the key); the env ref stays the plaintext's content hash. Pruning leaves no env row that
no remaining process names (before, ``prune_terminal`` left every env row behind)."""

from __future__ import annotations

import pytest

from procledger import CipherError, ProcessRegistry
from procledger.application.cipher import KEY_VARIABLE, new_key
from procledger.testing import FakeClock
from registry.conformance import KEY, registration

from ._raw import Raw

SECRET = "hunter2-do-not-leak"
ENV = {"API_TOKEN": SECRET, "HOME": "/home/someone"}


def _env_rows(raw: Raw) -> list[tuple[str, str]]:
    return [(str(r), str(e)) for r, e in raw.run(f"SELECT env_ref, env FROM {raw.table('envs')}")]


def test_with_a_key_the_row_holds_ciphertext_and_the_ref_is_the_plaintext_hash(
    registry: ProcessRegistry, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain_ref = registry.store_env({"OTHER": "x"})  # no key: a plain row
    key = new_key()
    monkeypatch.setenv(KEY_VARIABLE, key)
    env_ref = registry.store_env(ENV)
    raw = Raw(url)
    try:
        rows = dict(_env_rows(raw))
    finally:
        raw.close()
    assert rows[env_ref].startswith("aesgcm:v1:")
    assert SECRET not in rows[env_ref]
    assert "API_TOKEN" not in rows[env_ref]
    assert rows[plain_ref].startswith("{")
    assert registry.load_env(env_ref) == ENV
    assert registry.load_env(plain_ref) == {"OTHER": "x"}  # old plain rows stay readable
    monkeypatch.delenv(KEY_VARIABLE)
    assert registry.store_env(ENV) == env_ref  # the ref does not depend on the key


def test_without_the_key_or_with_another_one_reading_names_the_ref_not_the_key(
    registry: ProcessRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = new_key()
    monkeypatch.setenv(KEY_VARIABLE, key)
    env_ref = registry.store_env(ENV)
    monkeypatch.delenv(KEY_VARIABLE)
    with pytest.raises(CipherError, match="is not set") as unset:
        registry.load_env(env_ref)
    other = new_key()
    monkeypatch.setenv(KEY_VARIABLE, other)
    with pytest.raises(CipherError, match="not the key") as wrong:
        registry.load_env(env_ref)
    monkeypatch.setenv(KEY_VARIABLE, "not-a-key")
    with pytest.raises(CipherError, match="32 bytes") as malformed:
        registry.load_env(env_ref)
    for caught in (unset, wrong, malformed):
        assert env_ref in str(caught.value)
        assert key not in str(caught.value)
        assert other not in str(caught.value)


def test_storing_again_with_a_key_encrypts_a_plain_row(
    registry: ProcessRegistry, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_ref = registry.store_env(ENV)
    monkeypatch.setenv(KEY_VARIABLE, new_key())
    assert registry.store_env(ENV) == env_ref
    raw = Raw(url)
    try:
        assert SECRET not in dict(_env_rows(raw))[env_ref]
    finally:
        raw.close()
    assert registry.load_env(env_ref) == ENV


def test_a_row_moved_under_another_ref_does_not_decrypt(
    registry: ProcessRegistry, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_VARIABLE, new_key())
    secret_ref = registry.store_env(ENV)
    other_ref = registry.store_env({"A": "b"})
    raw = Raw(url)
    try:
        sealed = dict(_env_rows(raw))[secret_ref]
        raw.run(f"UPDATE {raw.table('envs')} SET env=? WHERE env_ref=?", (sealed, other_ref))
    finally:
        raw.close()
    with pytest.raises(CipherError, match=other_ref):
        registry.load_env(other_ref)


def _finished(registry: ProcessRegistry, process_id: str, env_ref: str) -> None:
    registry.register(registration(process_id, env_ref=env_ref))
    registry.record_started(process_id, 1)
    registry.record_completed(process_id, "exited", "exited", exit_code=0, authority=KEY)


def test_prune_leaves_no_env_row_and_no_head_row(
    registry: ProcessRegistry, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_VARIABLE, new_key())
    shared = registry.store_env(ENV)
    alone = registry.store_env({"ONLY": "one"})
    _finished(registry, "p1", shared)
    _finished(registry, "p2", shared)
    _finished(registry, "p3", alone)
    report = registry.prune_terminal(registry.now_ms() + 1)
    assert report.processes == ["p1", "p2", "p3"]
    raw = Raw(url)
    try:
        assert _env_rows(raw) == []
        assert raw.run(f"SELECT * FROM {raw.table('heads')}") == []
    finally:
        raw.close()
    assert registry.verify().ok


def test_prune_keeps_an_env_row_a_remaining_process_names(
    registry: ProcessRegistry, url: str, clock: FakeClock
) -> None:
    shared = registry.store_env(ENV)
    _finished(registry, "old", shared)
    cutoff = registry.now_ms() + 1
    clock.advance(10)
    registry.register(registration("still-running", env_ref=shared))
    registry.prune_terminal(cutoff)
    assert registry.load_env(shared) == ENV
    registry.record_completed("still-running", "failed", "failed", authority=KEY)
    registry.prune_terminal(registry.now_ms() + 1)
    raw = Raw(url)
    try:
        assert _env_rows(raw) == []
    finally:
        raw.close()
