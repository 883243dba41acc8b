"""The worker's memory of the attempts it started (worker/runs.py ``Ran``): what tells a
result the database forgot (a failover to a lagging standby) from a claim that committed
unanswered."""

from __future__ import annotations

from conveyor.worker.runs import Ran


def test_remembers_the_attempts_started_not_other_attempts() -> None:
    ran = Ran()
    ran.add((7, 1))
    assert (7, 1) in ran
    assert (7, 2) not in ran  # the same execution under another attempt was never run here
    assert (8, 1) not in ran


def test_keeps_the_last_size_keys_and_forgets_the_oldest() -> None:
    ran = Ran(size=3)
    for eid in (1, 2, 3, 4):
        ran.add((eid, 1))
    assert [(eid, 1) in ran for eid in (1, 2, 3, 4)] == [False, True, True, True]


def test_adding_a_key_twice_does_not_evict_another() -> None:
    ran = Ran(size=2)
    ran.add((1, 1))
    ran.add((2, 1))
    ran.add((2, 1))
    assert (1, 1) in ran
    assert (2, 1) in ran
