"""Pure unit tests of the retry and lost-worker policies and their backoff."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor.domain.policy import RetryPolicy, WorkerLostPolicy, backoff


class _FixedDraw:
    """An rng whose draw is fixed, to pin the jitter at its ends."""

    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


# ---------------------------------------------------------------------------
# backoff
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("retry_number", "base", "cap", "ceiling"),
    [
        (1, 1.0, 60.0, 1.0),
        (2, 1.0, 60.0, 2.0),
        (3, 1.0, 60.0, 4.0),
        (4, 0.5, 60.0, 4.0),
        (7, 1.0, 60.0, 60.0),  # 64 capped
        (50, 2.0, 10.0, 10.0),
    ],
)
def test_backoff_doubles_up_to_the_cap_and_jitters_down_to_half(
    retry_number: int, base: float, cap: float, ceiling: float
) -> None:
    assert backoff(retry_number, base, cap, _FixedDraw(0.0)) == pytest.approx(ceiling / 2)
    assert backoff(retry_number, base, cap, _FixedDraw(0.5)) == pytest.approx(ceiling * 0.75)
    # random() is in [0, 1): the ceiling itself is the supremum.
    assert backoff(retry_number, base, cap, _FixedDraw(1.0 - 1e-12)) == pytest.approx(ceiling)


@pytest.mark.parametrize(("retry_number", "base"), [(0, 1.0), (-3, 1.0), (1, 0.0), (5, -1.0)])
def test_backoff_is_zero_without_a_retry_number_or_a_base(retry_number: int, base: float) -> None:
    assert backoff(retry_number, base, 60.0) == 0.0


def test_backoff_with_a_zero_cap_is_zero() -> None:
    assert backoff(3, 1.0, 0.0) == 0.0


def test_backoff_jitter_spreads_over_the_whole_range() -> None:
    rng = random.Random(1234)
    draws = [backoff(3, 1.0, 60.0, rng) for _ in range(2000)]
    assert min(draws) >= 2.0
    assert max(draws) <= 4.0
    # Jittered, not constant: both halves of the range are hit.
    assert min(draws) < 2.2
    assert max(draws) > 3.8
    assert len(set(draws)) > 1900


@given(
    retry_number=st.integers(min_value=1, max_value=200),
    base=st.floats(min_value=0.001, max_value=1000, allow_nan=False),
    cap=st.floats(min_value=0, max_value=10_000, allow_nan=False),
    draw=st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_backoff_bounds_hold_for_any_input(retry_number: int, base: float, cap: float, draw: float) -> None:
    ceiling = min(cap, base * 2.0 ** (retry_number - 1))
    delay = backoff(retry_number, base, cap, _FixedDraw(draw))
    assert ceiling / 2 <= delay <= ceiling
    assert delay <= cap


def test_backoff_without_rng_uses_the_module_random(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random, "random", lambda: 0.0)
    assert backoff(2, 1.0, 60.0) == 1.0


# ---------------------------------------------------------------------------
# RetryPolicy: the action's own failures
# ---------------------------------------------------------------------------


def test_retry_policy_default_is_no_retry() -> None:
    policy = RetryPolicy()
    assert policy.max_attempts == 1
    for outcome in ("failed", "timeout", "completed"):
        assert policy.next_delay(1, outcome) is None


def test_retry_policy_retries_until_max_attempts_with_growing_backoff() -> None:
    policy = RetryPolicy(max_attempts=4, backoff_base=2.0, backoff_max=60.0)
    first = policy.next_delay(1, "failed")
    second = policy.next_delay(2, "timeout")
    third = policy.next_delay(3, "failed")
    assert first is not None
    assert 1.0 <= first <= 2.0
    assert second is not None
    assert 2.0 <= second <= 4.0
    assert third is not None
    assert 4.0 <= third <= 8.0
    # The 4th attempt was the last one.
    assert policy.next_delay(4, "failed") is None
    assert policy.next_delay(9, "failed") is None


def test_retry_policy_backoff_is_capped() -> None:
    policy = RetryPolicy(max_attempts=100, backoff_base=1.0, backoff_max=5.0)
    delays = [policy.next_delay(n, "failed") for n in range(1, 100)]
    assert all(d is not None and 0 < d <= 5.0 for d in delays)
    assert all(d is not None and d >= 2.5 for d in delays[4:])


def test_retry_policy_retries_only_the_listed_outcomes() -> None:
    policy = RetryPolicy(max_attempts=3, retry_on=frozenset({"timeout"}))
    assert policy.next_delay(1, "timeout") is not None
    assert policy.next_delay(1, "failed") is None
    assert policy.next_delay(1, "completed") is None
    assert RetryPolicy(max_attempts=3).next_delay(1, "completed") is None


def test_retry_policy_zero_base_retries_at_once() -> None:
    assert RetryPolicy(max_attempts=2, backoff_base=0.0).next_delay(1, "failed") == 0.0


def test_retry_policy_overrides() -> None:
    default = RetryPolicy(max_attempts=1, backoff_base=1.0, backoff_max=60.0)
    assert default.overridden(None) is default
    assert default.overridden({}) is default

    partial = default.overridden({"max_attempts": 3})
    assert partial == RetryPolicy(max_attempts=3, backoff_base=1.0, backoff_max=60.0)

    full = default.overridden({"max_attempts": "5", "backoff_base": 0.25, "backoff_max": "2", "retry_on": ["timeout"]})
    assert full == RetryPolicy(max_attempts=5, backoff_base=0.25, backoff_max=2.0, retry_on=frozenset({"timeout"}))
    assert isinstance(full.retry_on, frozenset)
    assert full.next_delay(1, "failed") is None
    delay = full.next_delay(4, "timeout")
    assert delay is not None
    assert 1.0 <= delay <= 2.0
    # The original is unchanged (frozen).
    assert default.max_attempts == 1


# ---------------------------------------------------------------------------
# WorkerLostPolicy: the platform lost the worker mid-run
# ---------------------------------------------------------------------------


def test_worker_lost_default_reruns_three_times_then_abandons() -> None:
    policy = WorkerLostPolicy()
    assert (policy.on_worker_lost, policy.max_attempts) == ("retry", 3)
    # The first loss: run again at once.
    assert policy.next_delay(1) == 0.0
    second = policy.next_delay(2)
    assert second is not None
    assert 0.5 <= second <= 1.0
    # The third loss reached the bound.
    assert policy.next_delay(3) is None
    assert policy.next_delay(4) is None


def test_worker_lost_first_rerun_is_immediate_whatever_the_base() -> None:
    for base in (0.1, 1.0, 30.0):
        assert WorkerLostPolicy(max_attempts=10, backoff_base=base).next_delay(1) == 0.0


def test_worker_lost_backoff_doubles_after_the_first_rerun_and_is_capped() -> None:
    policy = WorkerLostPolicy(max_attempts=20, backoff_base=2.0, backoff_max=10.0)
    for lost, ceiling in [(2, 2.0), (3, 4.0), (4, 8.0), (5, 10.0), (12, 10.0)]:
        for _ in range(50):
            delay = policy.next_delay(lost)
            assert delay is not None
            assert ceiling / 2 <= delay <= ceiling, (lost, delay)


def test_worker_lost_bound_of_one_abandons_at_once() -> None:
    assert WorkerLostPolicy(max_attempts=1).next_delay(1) is None


def test_worker_lost_abandon_mode_never_reruns() -> None:
    policy = WorkerLostPolicy(on_worker_lost="abandon", max_attempts=10)
    assert [policy.next_delay(n) for n in range(1, 5)] == [None] * 4


def test_worker_lost_overrides_from_action_metadata() -> None:
    default = WorkerLostPolicy(on_worker_lost="retry", max_attempts=3, backoff_base=1.5, backoff_max=7.0)
    assert default.overridden(None) == default
    assert default.overridden({}) == default
    # Unrelated metadata (what a Python action stores anyway) changes nothing.
    assert default.overridden({"async": False, "entry_point": "m:f", "timeout": 5}) == default

    abandon = default.overridden({"on_worker_lost": "abandon"})
    assert abandon == WorkerLostPolicy(on_worker_lost="abandon", max_attempts=3, backoff_base=1.5, backoff_max=7.0)
    assert abandon.next_delay(1) is None

    bounded = default.overridden({"worker_lost_max_attempts": 1})
    assert bounded.max_attempts == 1
    assert bounded.next_delay(1) is None

    more = default.overridden({"worker_lost_max_attempts": "5"})
    assert more.max_attempts == 5
    assert more.next_delay(4) is not None
    assert more.next_delay(5) is None

    # The backoff stays the configured one: it is not a per-action setting.
    assert (more.backoff_base, more.backoff_max) == (1.5, 7.0)

    # A retry mode given per action wins over a configured abandon.
    assert WorkerLostPolicy(on_worker_lost="abandon").overridden({"on_worker_lost": "retry"}).next_delay(1) == 0.0


def test_worker_lost_unknown_mode_in_metadata_keeps_the_configured_one() -> None:
    assert WorkerLostPolicy(on_worker_lost="retry").overridden({"on_worker_lost": "explode"}).on_worker_lost == "retry"
    assert WorkerLostPolicy(on_worker_lost="abandon").overridden({"on_worker_lost": None}).on_worker_lost == "abandon"


def test_registry_policy_metadata_feeds_the_policies() -> None:
    """What the decorator stores is what the policies read."""
    from conveyor.actions.registry import ActionRegistry

    registry = ActionRegistry()

    @registry.action(
        "t.fragile",
        on_worker_lost="abandon",
        worker_lost_max_attempts=2,
        retry={"max_attempts": 2, "retry_on": ["failed"]},
        scheduled_timeout=7,
        timeout=3,
    )
    def fragile() -> None:
        pass

    definition = registry.get("t.fragile")
    assert definition is not None
    metadata = definition.metadata
    assert metadata["scheduled_timeout"] == 7
    assert metadata["timeout"] == 3
    lost = WorkerLostPolicy().overridden(metadata)
    assert (lost.on_worker_lost, lost.max_attempts) == ("abandon", 2)
    retry = RetryPolicy().overridden(metadata["retry"])
    assert (retry.max_attempts, retry.retry_on) == (2, frozenset({"failed"}))

    # Refused when the decorator is applied.
    with pytest.raises(ValueError, match="on_worker_lost"):
        registry.action("t.bad", on_worker_lost="sometimes")(fragile)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown retry settings"):
        registry.action("t.bad2", retry={"tries": 3})(fragile)
