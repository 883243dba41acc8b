"""The executions search's parameters term (api/search.py): strict JSON, like every door."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor.api.search import parse_parameters
from conveyor.domain.errors import ConveyorError


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_a_json_object_with_a_number_json_cannot_carry_is_refused(constant: str) -> None:
    with pytest.raises(ConveyorError, match="not valid JSON"):
        parse_parameters(f'{{"n": {constant}}}')


def test_pairs_read_such_a_value_as_text() -> None:
    """``n=NaN`` searches for the string NaN: it is not a number anything could hold."""
    assert parse_parameters("n=NaN m=1e400 k=5 ok=true") == {"n": "NaN", "m": "1e400", "k": 5, "ok": True}


@given(st.text(max_size=200))
def test_any_text_is_a_search_or_a_clear_refusal(text: str) -> None:
    message = ""
    try:
        found = parse_parameters(text)
    except ConveyorError as exc:
        message, found = str(exc), None
        assert message.startswith("the parameters search"), message
    assert found is None or isinstance(found, dict)
