"""The automation pages' doors (pure): query-string filters and path ids. Any input
parses to known values or a problem listed on the page, never an exception; an id that
is not a positive integer is a 404."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor.api.dashboard.automation import OUTCOMES, EnforcementFilters, EventFilters, positive_id
from conveyor.api.dashboard.data import NotFound
from conveyor.domain.ids import MAX_ID

params = st.dictionaries(st.sampled_from(["trigger", "before", "outcome", "rule", "other"]), st.text(max_size=300))


@given(params)
def test_any_query_string_parses(values: dict[str, str]) -> None:
    events = EventFilters.parse(values)
    assert events.before is None or events.before >= 1
    assert events.trigger is None or 0 < len(events.trigger) <= 255
    enforcements = EnforcementFilters.parse(values)
    assert enforcements.outcome is None or enforcements.outcome in OUTCOMES
    for f in (events, enforcements):
        assert isinstance(f.query(), str)
        assert all(isinstance(p, str) for p in f.problems)


def test_filters_round_trip_and_problems() -> None:
    f = EnforcementFilters.parse({"outcome": "requested", "rule": " deploy ", "before": "17"})
    assert (f.outcome, f.rule, f.before, f.problems) == ("requested", "deploy", 17, [])
    assert f.query() == "outcome=requested&rule=deploy&before=17"
    assert EnforcementFilters.parse({"outcome": "nope"}).problems == ["unknown outcome 'nope'"]
    for bad in ("-1", "²", "١٢"):  # digits to str.isdigit(), not all to int(): refused, never a 500
        assert EventFilters.parse({"before": bad}).problems == ["before must be a positive integer"]


@given(st.one_of(st.text(max_size=40), st.sampled_from(["²", "³1", "١٢", "12"])))
def test_path_ids(raw: str) -> None:
    if raw.isascii() and raw.isdigit() and 1 <= int(raw) <= MAX_ID:
        assert positive_id(raw, "event") == int(raw)
    else:
        with pytest.raises(NotFound, match=r"^no event "):
            positive_id(raw, "event")


def test_path_id_bounds() -> None:
    assert positive_id("1", "event") == 1
    for bad in ("0", "", "1e3", "²", str(MAX_ID + 1)):
        with pytest.raises(NotFound):
            positive_id(bad, "event")
