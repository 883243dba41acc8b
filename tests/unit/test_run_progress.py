"""Pure unit tests: what ``conveyor run --wait`` shows of an execution's progress on a
terminal: a line per change, a failed attempt's error before its retry, user data as it
is. No database, no processes (the acceptance test runs it under a pseudo-terminal)."""

from __future__ import annotations

import io
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from rich.console import Console

from conveyor.cli import run_progress
from conveyor.cli.run_progress import Progress
from conveyor.domain.models import Attempt, Execution
from conveyor.domain.status import ExecutionStatus as S

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
MARKUP = "[red]x[/red] [/oops] [bold :smile:"


def execution(status: S, attempt: int = 0, worker_name: str | None = None) -> Execution:
    return Execution(
        id=42, action_ref="shop.tag", parameters={}, status=status, result=None,
        worker=1 if worker_name else None, worker_name=worker_name, executor=None, parent=None, enforcement=None,
        attempt=attempt, created=NOW, updated=NOW, scheduled=None, started=None, ended=None,
    )  # fmt: skip


class Recorder:
    def __init__(self, attempts: tuple[Attempt, ...] = ()) -> None:
        self.out = io.StringIO()
        self.console = Console(file=self.out, width=200, markup=False, emoji=False, color_system=None)
        self.attempts = attempts
        self.reads = 0
        self.time = 0.0

    def progress(self, action_ref: str = "shop.tag") -> Progress:
        def attempts() -> tuple[Attempt, ...]:
            self.reads += 1
            return self.attempts

        return Progress(self.console, 42, action_ref, attempts, clock=lambda: self.time)

    def lines(self) -> list[str]:
        return [text.rstrip() for text in self.out.getvalue().splitlines()]


def test_a_line_per_change_with_attempt_and_worker() -> None:
    rec = Recorder()
    shown = rec.progress()
    for t, e in [
        (0.0, execution(S.REQUESTED)),
        (0.2, execution(S.REQUESTED)),  # nothing changed: no line
        (0.4, execution(S.SCHEDULED, 1, "w-1")),
        (0.6, execution(S.RUNNING, 1, "w-1")),
        (2.6, execution(S.RUNNING, 1, "w-1")),
        (2.8, execution(S.COMPLETED, 1, "w-1")),
    ]:
        rec.time = t
        shown(e)
    assert rec.lines() == [
        "   0.0s  requested",
        "   0.4s  scheduled  attempt 1  on w-1",
        "   0.6s  running  attempt 1  on w-1",
        "   2.8s  completed  attempt 1  on w-1",
    ]
    assert rec.reads == 0  # no attempt ended before the last: never read


def test_a_retried_attempt_says_how_it_ended_once() -> None:
    failed = Attempt(1, 1, "w-1", NOW, NOW, NOW, "failed", "boom: exit code 3")
    rec = Recorder((failed, Attempt(2, 2, "w-2", NOW, None, None, None, None)))
    shown = rec.progress()
    shown(execution(S.RUNNING, 1, "w-1"))
    backoff = replace(execution(S.REQUESTED, 1), not_before=datetime(2026, 1, 2, 3, 4, 9, tzinfo=UTC))
    shown(backoff)
    shown(backoff)
    shown(execution(S.RUNNING, 2, "w-2"))
    lines = rec.lines()
    assert lines[1] == "   0.0s  attempt 1 ended on w-1: failed: boom: exit code 3"
    assert lines[2].startswith("   0.0s  requested (at ")  # the retry's backoff, in local time
    assert lines[3] == "   0.0s  running  attempt 2  on w-2"
    assert len(lines) == 4
    assert rec.reads == 1


def test_attempts_missed_between_reads_are_reported() -> None:
    """Seen first at attempt 3 (an idempotent re-run, or reads far apart): 1 and 2 ended."""
    rec = Recorder(tuple(Attempt(n, n, f"w-{n}", NOW, NOW, NOW, "abandoned", None) for n in (1, 2)))
    rec.progress()(execution(S.RUNNING, 3, "w-3"))
    assert rec.lines() == [
        "   0.0s  attempt 1 ended on w-1: abandoned",
        "   0.0s  attempt 2 ended on w-2: abandoned",
        "   0.0s  running  attempt 3  on w-3",
    ]


def test_user_data_is_shown_as_it_is() -> None:
    failed = Attempt(1, 1, MARKUP, NOW, NOW, NOW, "failed", MARKUP)
    rec = Recorder((failed,))
    shown = rec.progress(action_ref=MARKUP)
    shown(execution(S.RUNNING, 1, MARKUP))
    shown(execution(S.REQUESTED, 1))
    assert rec.lines() == [
        f"   0.0s  running  attempt 1  on {MARKUP}",
        f"   0.0s  attempt 1 ended on {MARKUP}: failed: {MARKUP}",
        "   0.0s  requested  attempt 1",
    ]


def test_the_spinner_names_the_execution_and_goes_away() -> None:
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=True, markup=False, emoji=False, color_system=None)
    with Progress(console, 42, MARKUP, tuple) as shown:
        shown(execution(S.RUNNING, 1, "w-1"))
    text = out.getvalue()
    assert f"waiting for execution 42 {MARKUP}: running  attempt 1  on w-1" in text
    assert "running  attempt 1  on w-1\n" in text


@pytest.mark.parametrize(
    ("as_json", "stdout", "stderr", "expected"),
    [
        (False, True, True, True),
        (True, True, True, False),
        (False, False, True, False),  # piped or redirected
        (False, True, False, False),  # stderr redirected (2>log)
    ],
)
def test_progress_is_for_a_terminal_only(
    monkeypatch: pytest.MonkeyPatch, as_json: bool, stdout: bool, stderr: bool, expected: bool
) -> None:
    monkeypatch.setattr(run_progress.sys.stdout, "isatty", lambda: stdout)
    monkeypatch.setattr(run_progress.sys.stderr, "isatty", lambda: stderr)
    assert run_progress.wanted(as_json) is expected
