"""The one id bound every door checks (conveyor.domain.ids)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from conveyor.domain.ids import MAX_ID, is_id, parse_id


def test_the_bounds() -> None:
    assert MAX_ID == 2**62
    assert [parse_id(t) for t in ("1", "007", str(MAX_ID), "0" * 30 + "5")] == [1, 7, MAX_ID, 5]
    for bad in ("0", "", "-1", "+1", " 1", "1e3", "²", "١٢", str(MAX_ID + 1), "9" * 5000):
        assert parse_id(bad) is None, bad
    assert [is_id(v) for v in (1, MAX_ID, 0, MAX_ID + 1, True, 1.0, "1")] == [True, True] + [False] * 5


@given(st.one_of(st.text(max_size=40), st.integers(min_value=0, max_value=2**70).map(str)))
def test_parse_id_is_the_digits_in_range(raw: str) -> None:
    expected = int(raw) if raw.isascii() and raw.isdigit() and 1 <= int(raw) <= MAX_ID else None
    assert parse_id(raw) == expected
