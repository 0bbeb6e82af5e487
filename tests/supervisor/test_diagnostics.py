"""``clip_diagnostic``: the one rule both the Supervisor and recovery fit diagnostics with."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from procledger.domain.diagnostics import CLIP_MARKER, clip_diagnostic
from procledger.domain.records import MAX_DIAGNOSTIC_BYTES

# Every code point, lone surrogates included (a file name decoded with surrogateescape), and
# long enough in bytes (up to 4 per character) to need clipping about half the time.
any_text = st.text(st.characters(exclude_categories=()), max_size=300)
wide_text = st.text(st.sampled_from("aé€😀"), min_size=100, max_size=400)


@given(st.one_of(any_text, wide_text))
@example("x" * MAX_DIAGNOSTIC_BYTES)
@example("x" * (MAX_DIAGNOSTIC_BYTES + 1))
@example("é" * MAX_DIAGNOSTIC_BYTES)
def test_a_clipped_diagnostic_fits_a_record(text: str) -> None:
    clipped = clip_diagnostic(text)
    data = clipped.encode()  # valid UTF-8: no surrogate survives
    assert len(data) <= MAX_DIAGNOSTIC_BYTES
    assert data.decode() == clipped


@given(st.text(max_size=MAX_DIAGNOSTIC_BYTES // 4))
def test_a_short_diagnostic_is_unchanged(text: str) -> None:
    assert clip_diagnostic(text) == text


@given(
    st.one_of(any_text, wide_text).filter(
        lambda t: len(t.encode("utf-8", "replace")) > MAX_DIAGNOSTIC_BYTES
    )
)
@example("x" * (MAX_DIAGNOSTIC_BYTES + 1))
def test_a_long_diagnostic_keeps_its_start_and_ends_with_the_marker(text: str) -> None:
    clipped = clip_diagnostic(text)
    assert clipped.endswith(CLIP_MARKER)
    kept = clipped.removesuffix(CLIP_MARKER)
    assert text.encode("utf-8", "replace").startswith(kept.encode())
    assert len(clipped.encode()) > MAX_DIAGNOSTIC_BYTES - 4 - len(CLIP_MARKER.encode())
