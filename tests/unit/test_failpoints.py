"""The failpoint spec (conveyor/ops/failpoints.py): which points are armed, on which pass, and
whether they kill or freeze the process."""

from __future__ import annotations

import pytest

from conveyor.ops.failpoints import _parse


def test_points_kill_by_default_and_freeze_with_stop() -> None:
    points, stops = _parse("scheduler.after_claim, schedules.after_slot_row@3:stop,events.before_commit@2")
    assert points == {"scheduler.after_claim": 1, "schedules.after_slot_row": 3, "events.before_commit": 2}
    assert stops == {"schedules.after_slot_row"}


def test_an_unknown_action_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown failpoint action 'pause'"):
        _parse("schedules.before_commit:pause")
