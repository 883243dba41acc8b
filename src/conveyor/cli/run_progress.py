"""``conveyor run --wait`` on a terminal: the execution's progress on stderr while it waits.

A line per change (status, attempt, worker, a delayed start), a spinner in between. The
database notifies only an execution's end, so the changes are read by polling the row
(``Client.wait``'s ``on_poll``); a change that comes and goes between two reads is not
shown, the status it leads to is. Everything shown from the row is user data (action
refs, worker names, error text): it goes through ``Text``, never parsed as markup."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from types import TracebackType

from rich.console import Console
from rich.status import Status
from rich.text import Text

from conveyor.cli.context import line, styled
from conveyor.cli.executions import _status as status_text
from conveyor.domain.models import Attempt, Execution
from conveyor.domain.status import ExecutionStatus

# How often the row is read while progress is shown: changes appear within this, and a
# waiting CLI costs the database a primary-key read per interval.
POLL_INTERVAL = 0.25


def wanted(as_json: bool) -> bool:
    """Progress only for a person at a terminal: output piped or redirected (stdout or
    stderr), or asked for as JSON, is read by a program, which gets what it always got."""
    return not as_json and sys.stdout.isatty() and sys.stderr.isatty()


class Progress:
    """``on_poll`` for ``Client.wait``: prints a line on ``console`` whenever what it shows
    changes, and keeps a spinner below the lines until the context exits. ``attempts``
    reads the execution's attempts (called only when an attempt ended without ending the
    execution, to say why it is tried again)."""

    def __init__(
        self,
        console: Console,
        execution_id: int,
        action_ref: str,
        attempts: Callable[[], Sequence[Attempt]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console
        self.execution_id = execution_id
        self.action_ref = action_ref
        self.attempts = attempts
        self.clock = clock
        self.began = clock()
        self.shown: tuple[object, ...] | None = None
        self.reported = 0  # the attempts up to this one were said to have ended
        self.spinner: Status | None = None

    def __enter__(self) -> Progress:
        self.spinner = self.console.status(self._waiting(None))
        self.spinner.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.spinner is not None:
            self.spinner.stop()  # transient: the spinner's line goes, the status lines stay

    def __call__(self, execution: Execution) -> None:
        # The attempts before the current one ended without ending the execution, and so
        # did the current one when the execution is back in 'requested' (a retry, a lost
        # dispatch): say how, once each, before the status that follows.
        ended = execution.attempt if execution.status is ExecutionStatus.REQUESTED else execution.attempt - 1
        if ended > self.reported:
            self._ended_attempts(self.reported + 1, ended)
            self.reported = ended
        now = (execution.status, execution.attempt, execution.worker_name, execution.not_before)
        if now != self.shown:
            self.shown = now
            self.console.print(line(f"{self._elapsed():>7}  ", *self._describe(execution)))
        if self.spinner is not None:
            self.spinner.update(self._waiting(execution))

    def _elapsed(self) -> str:
        return f"{self.clock() - self.began:.1f}s"

    def _describe(self, e: Execution) -> list[str | Text]:
        parts: list[str | Text] = [status_text(e.status, e.not_before)]
        if e.attempt > 0:  # 0: never claimed yet
            parts.append(f"  attempt {e.attempt}")
        if e.worker_name is not None:
            parts.append(f"  on {e.worker_name}")
        return parts

    def _ended_attempts(self, first: int, last: int) -> None:
        for a in self.attempts():
            if first <= a.attempt <= last:
                ended: list[str | Text] = [f"{self._elapsed():>7}  ", styled(f"attempt {a.attempt} ended", "yellow")]
                if a.worker_name:
                    ended.append(f" on {a.worker_name}")
                if a.outcome:
                    ended.append(f": {a.outcome}")
                if a.error:
                    ended.append(f": {a.error}")
                self.console.print(line(*ended))

    def _waiting(self, e: Execution | None) -> Text:
        head = line(f"waiting for execution {self.execution_id} ", (self.action_ref, "bold"))
        if e is None:
            return head
        return line(head, ": ", *self._describe(e), f"  ({self._elapsed()})")
