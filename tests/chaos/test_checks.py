"""The chaos suite's oracle, on made-up runs: what counts as two runs at once, a limit
exceeded, a FIFO inversion -- and what does not. Quick, no processes (not marked chaos)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from .checks import Report, _fifo, _limits, _overlaps

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def run(
    execution: int,
    attempt: int,
    start: float,
    end: float | None,
    *,
    action: str = "chaos.fast",
    group: str | None = None,
    outcome: str | None = "completed",
    killed_at: float | None = None,
) -> dict[str, Any]:
    """A ledger row as checks.RUNS returns it: ``end`` None with ``killed_at`` is a run
    whose process was killed; both None, a run still open on a live process."""
    until = end if end is not None else killed_at
    return {
        "execution": execution,
        "attempt": attempt,
        "worker": f"w{attempt}",
        "action": action,
        "grp": group,
        "started": T0 + timedelta(seconds=start),
        "ended": T0 + timedelta(seconds=end) if end is not None else None,
        "until": T0 + timedelta(seconds=until) if until is not None else None,
        "process_died": killed_at is not None,
        "attempt_outcome": outcome,
    }


def test_runs_of_one_execution_may_overlap_only_after_the_first_was_fenced() -> None:
    report = Report()
    _overlaps(
        report,
        [
            run(1, 1, 0, 1, outcome="worker_lost"),  # declared dead, still running a moment: allowed
            run(1, 2, 0.5, 2),
            run(2, 1, 0, 1, outcome="failed"),  # a retry that began before the first attempt ended
            run(2, 2, 0.9, 2),
            run(3, 1, 0, None, outcome="worker_lost", killed_at=0.4),  # killed, then re-run: no overlap
            run(3, 2, 0.5, 1),
            run(4, 1, 0, 1),  # one after the other
            run(4, 2, 1, 2),
        ],
    )
    assert len(report.violations) == 1
    assert "2#1" in report.violations[0]
    assert "1 overlaps, each with a fenced earlier attempt" in report.lines[0]


def test_a_limit_counts_distinct_executions_and_ends_runs_at_their_kill() -> None:
    fifo = {"action": "chaos.fifo", "group": "a"}
    report = Report()
    _limits(
        report,
        [
            run(1, 1, 0, None, killed_at=1.0, **fifo),  # killed at 1.0 ...
            run(1, 2, 0.5, 2, **fifo),  # ... its re-run overlaps: still one execution
            run(2, 1, 2, 3, **fifo),  # starts the instant the other ends: not at once
            run(3, 1, 0, 5, action="chaos.fifo", group="b"),  # another group
        ],
    )
    assert report.violations == []
    _limits(report, [run(1, 1, 0, 2, **fifo), run(2, 1, 1.9, 3, **fifo)])
    assert len(report.violations) == 1
    assert "chaos.fifo group a: 2 running" in report.violations[0]


def test_pairs_and_the_global_gate() -> None:
    report = Report()
    pair = {"action": "chaos.pair", "group": "x"}
    _limits(report, [run(1, 1, 0, 3, **pair), run(2, 1, 1, 3, **pair), run(3, 1, 2, 4, **pair)])
    assert len(report.violations) == 1
    gated = [run(i, 1, i * 0.1, 1, action="chaos.gated") for i in range(3)]
    _limits(report, gated)
    assert len(report.violations) == 2
    assert "chaos.gated group None: 3 running" in report.violations[1]


def test_fifo_is_the_order_of_first_starts() -> None:
    fifo = {"action": "chaos.fifo", "group": "a"}
    report = Report()
    # 5 was re-run after 6 started: its first start counts, which was first.
    _fifo(report, [run(5, 1, 0, None, killed_at=1, **fifo), run(6, 1, 2, 3, **fifo), run(5, 2, 4, 5, **fifo)])
    assert report.violations == []
    _fifo(report, [run(8, 1, 0, 1, **fifo), run(7, 1, 2, 3, **fifo), run(9, 1, 1, 2, action="chaos.pair", group="a")])
    assert len(report.violations) == 1
    assert "execution 7 started" in report.violations[0]
