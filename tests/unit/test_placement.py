"""Pure unit tests: placement of claimed executions on workers (capable, least loaded,
within capacity). No database, no processes."""

from __future__ import annotations

from conveyor.domain.placement import Candidate, Claim, place

# ---------------------------------------------------------------------------
# Placement
# ---------------------------------------------------------------------------

PY_ACTIONS = ("core.echo", "core.noop", "core.sleep")


def py_claim(i: int, ref: str = "core.echo") -> Claim:
    return Claim(id=i, action_ref=ref, runner_type="python", runtime="python", age=0.0)


def sh_claim(i: int, ref: str = "core.local") -> Claim:
    return Claim(id=i, action_ref=ref, runner_type="subprocess", runtime="shell", age=0.0)


def worker(
    wid: int,
    *,
    capacity: int = 10,
    load: int = 0,
    runtimes: tuple[str, ...] = ("python", "shell"),
    actions: tuple[str, ...] = PY_ACTIONS,
) -> Candidate:
    return Candidate(id=wid, runtimes=list(runtimes), actions=list(actions), capacity=capacity, load=load)


def test_least_loaded_worker_wins_not_the_first() -> None:
    busy, idle = worker(1, load=5), worker(2, load=0)
    result = place([py_claim(100)], [busy, idle])
    assert result.assigned == [(100, 2)]
    assert not result.no_capacity
    assert not result.no_worker


def test_load_is_relative_to_capacity() -> None:
    # 3 of 4 slots taken (75 %) is busier than 5 of 20 (25 %).
    small, big = worker(1, capacity=4, load=3), worker(2, capacity=20, load=5)
    assert place([py_claim(1)], [small, big]).assigned == [(1, 2)]


def test_claims_spread_across_workers() -> None:
    a, b = worker(1), worker(2)
    result = place([py_claim(i) for i in range(6)], [a, b])
    per_worker = {1: 0, 2: 0}
    for _, wid in result.assigned:
        per_worker[wid] += 1
    assert per_worker == {1: 3, 2: 3}
    assert a.load == 3
    assert b.load == 3


def test_ties_broken_by_worker_id() -> None:
    result = place([py_claim(1)], [worker(7), worker(3), worker(5)])
    assert result.assigned == [(1, 3)]


def test_capacity_respected() -> None:
    a, b = worker(1, capacity=2), worker(2, capacity=1, load=1)
    result = place([py_claim(i) for i in range(5)], [a, b])
    assert result.assigned == [(0, 1), (1, 1)]
    assert result.no_capacity == [2, 3, 4]
    assert result.no_worker == []
    assert a.load == 2
    assert b.load == 1


def test_overloaded_worker_gets_nothing() -> None:
    # Load above capacity (capacity lowered on re-registration): no free slot.
    result = place([py_claim(1)], [worker(1, capacity=2, load=5)])
    assert result.no_capacity == [1]


def test_python_actions_only_go_to_workers_listing_them() -> None:
    lacks = worker(1, actions=("core.noop",))
    has = worker(2, load=9)
    result = place([py_claim(1, "core.echo")], [lacks, has])
    assert result.assigned == [(1, 2)]
    # The python runtime alone is not enough.
    result = place([py_claim(2, "mypack.thing")], [worker(1), worker(2)])
    assert result.no_worker == [2]


def test_subprocess_actions_go_to_any_worker_with_the_runtime() -> None:
    no_shell = worker(1, runtimes=("python",), actions=())
    shell = worker(2, runtimes=("shell",), actions=(), load=3)
    result = place([sh_claim(1)], [no_shell, shell])
    assert result.assigned == [(1, 2)]
    # Not listed in any worker's actions, yet placed: subprocess actions are data.
    assert place([sh_claim(2, "ops.custom")], [worker(3, actions=())]).assigned == [(2, 3)]
    assert place([sh_claim(3)], [no_shell]).no_worker == [3]


def test_no_worker_versus_no_capacity() -> None:
    full = worker(1, capacity=1, load=1)
    result = place([py_claim(1, "core.echo"), py_claim(2, "other.action")], [full])
    assert result.no_capacity == [1]
    assert result.no_worker == [2]
    assert result.assigned == []
    empty = place([py_claim(3)], [])
    assert empty.no_worker == [3]
    assert empty.no_capacity == []
    assert empty.assigned == []


def test_place_keeps_claim_order_and_mixes_kinds() -> None:
    claims = [py_claim(1), sh_claim(2), py_claim(3, "x.unknown"), py_claim(4)]
    result = place(claims, [worker(1, capacity=2), worker(2, capacity=1, runtimes=("shell",), actions=())])
    assert [eid for eid, _ in result.assigned] == [1, 2, 4]
    assert result.no_worker == [3]
    assigned = dict(result.assigned)
    assert assigned[1] == 1
    assert assigned[4] == 1


# ---------------------------------------------------------------------------
# Prefetch: executions a worker takes beyond its slots
# ---------------------------------------------------------------------------


def test_prefetch_takes_claims_beyond_the_slots_and_no_more() -> None:
    full = Candidate(id=1, runtimes=["python"], actions=list(PY_ACTIONS), capacity=2, load=2, prefetch=2)
    result = place([py_claim(i) for i in range(4)], [full])
    assert result.assigned == [(0, 1), (1, 1)]
    assert result.no_capacity == [2, 3]


def test_a_free_slot_anywhere_is_filled_before_anyones_prefetch() -> None:
    busy = Candidate(id=1, runtimes=["python"], actions=list(PY_ACTIONS), capacity=2, load=2, prefetch=4)
    idle = Candidate(id=2, runtimes=["python"], actions=list(PY_ACTIONS), capacity=2, load=1, prefetch=0)
    result = place([py_claim(i) for i in range(3)], [busy, idle])
    assert result.assigned[0] == (0, 2)  # the idle slot first
    assert [w for _, w in result.assigned[1:]] == [1, 1]  # then the busy worker's prefetch
