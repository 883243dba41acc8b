"""The automation gauges (issue #13), read from the 0016 tables by the executors' gauge
refresh: events waiting for their rules and the oldest one's wait, schedules paused and
active, and schedules overdue (active, next_fire more than 1 s past)."""

from __future__ import annotations

from prometheus_client import REGISTRY

from conveyor.executor import gauges
from integration.api_kit import Api
from integration.automation_kit import EVALUATED, emit, schedule


def sample(name: str, labels: dict[str, str] | None = None) -> float | None:
    return REGISTRY.get_sample_value(name, labels or {})


async def test_pending_events_and_schedule_states(api: Api) -> None:
    gauges.GAUGES.clear()
    await gauges.refresh(api.pool)
    assert sample("conveyor_events_pending") == 0
    assert sample("conveyor_events_pending_oldest_seconds") == 0
    assert sample("conveyor_schedules_overdue") == 0
    assert sample("conveyor_schedules", {"state": "active"}) == 0

    await api.sql("SELECT register_trigger('ops.alert', 'custom')")
    first, second, _third = [await emit(api, "ops.alert", {"n": n}) for n in range(3)]
    await api.sql(EVALUATED, (second,))
    # Test setup: the first has waited 30 s (as if no executor had evaluated its rules).
    await api.sql("UPDATE event_pending SET since = now() - interval '30 seconds' WHERE event = %s", (first,))
    await schedule(api, "on-time", next_in="1 minute")
    await schedule(api, "behind", next_in="-1 minute")
    await schedule(api, "held", next_in="-1 hour", paused=True)  # paused: never overdue
    await gauges.refresh(api.pool)

    assert sample("conveyor_events_pending") == 2  # first and third
    oldest = sample("conveyor_events_pending_oldest_seconds")
    assert oldest is not None
    assert 30 <= oldest < 90
    assert sample("conveyor_schedules", {"state": "active"}) == 2
    assert sample("conveyor_schedules", {"state": "paused"}) == 1
    assert sample("conveyor_schedules_overdue") == 1
