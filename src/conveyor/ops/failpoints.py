"""Crash points: let a test kill this process at an exact place in a protocol.

``CONVEYOR_FAILPOINTS="scheduler.after_claim,relay.before_dispatch_publish@3"`` makes the process
SIGKILL itself the first (or the ``@N``-th) time it reaches a named point, so the crash
windows the seeds name (after a claim, before a publish, between a state change and its
message) are tested where they are, not approximated with timing. Unset -- always, in
production -- each point costs one set lookup.

Points: ``scheduler.after_claim`` (claims committed, nothing placed),
``scheduler.after_dispatch`` (dispatch committed with its message in the outbox or NOTIFY),
``relay.before_dispatch_publish`` (outbox rows with dispatches read, nothing published),
``worker.before_result_commit`` (a result written -- slot released, next waiter promoted
-- but not committed). Workflow advancement (executor/workflows.py), all inside the one
transaction that applies a workflow's events unless said otherwise:
``workflow.after_dispatch_row`` (the dispatch rows of new children written, no child yet),
``workflow.after_child_row`` (the children requested and set on their dispatches),
``workflow.before_commit`` (everything applied, events deleted, not committed),
``workflow.after_commit`` (committed: the children's wake-ups are out, this executor has
not acted on anything since). Rules (executor/events.py), inside the one transaction of a pass
unless said otherwise: ``events.after_claim`` (pending events locked and read, nothing
written), ``events.after_enforcement`` (enforce_events returned: enforcements written,
executions requested, pending rows deleted), ``events.before_commit``, ``events.after_commit``
(committed, metrics not yet counted).
Schedule firing (executor/schedules.py): ``schedules.after_slot_row`` (a pass's slot rows
written and their executions requested, not committed), ``schedules.before_commit``,
``schedules.after_commit``. The dead-worker sweep (executor/recovery.py):
``recovery.after_sweep_lock`` (the sweep's transaction lock taken, nothing read).

A point suffixed ``:stop`` (``schedules.before_commit@2:stop``) SIGSTOPs the process there
instead: frozen exactly where it holds its locks, until the test sends SIGCONT -- a paused VM
or a stalled process, whose kernel still answers for its connections.

Hand-written: the failpoint libraries on PyPI are unmaintained or inject exceptions,
while a crash test needs the real thing: SIGKILL, no cleanup, no finally blocks.
"""

from __future__ import annotations

import os
import signal
import sys

ENV = "CONVEYOR_FAILPOINTS"


def _parse(spec: str) -> tuple[dict[str, int], set[str]]:
    """The armed points (name -> the pass that fires) and those that freeze (``:stop``)."""
    points: dict[str, int] = {}
    stops: set[str] = set()
    for item in filter(None, (part.strip() for part in spec.split(","))):
        item, _, action = item.partition(":")
        name, _, nth = item.partition("@")
        points[name] = int(nth) if nth else 1
        if action == "stop":
            stops.add(name)
        elif action:
            raise ValueError(f"{ENV}: unknown failpoint action {action!r} (only 'stop')")
    return points, stops


_ARMED, _STOPS = _parse(os.environ.get(ENV, ""))


def armed(name: str) -> bool:
    """True if reaching ``name`` now would crash (lets a caller make its work visible first)."""
    return _ARMED.get(name) == 1


def reach(name: str) -> None:
    """Count a pass through ``name``; SIGKILL this process on the armed pass."""
    left = _ARMED.get(name)
    if left is None:
        return
    if left > 1:
        _ARMED[name] = left - 1
        return
    if name in _STOPS:
        _ARMED.pop(name)  # resumed: carries on, as a process that was only paused does
        print(f"failpoint {name}: SIGSTOP pid {os.getpid()}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    print(f"failpoint {name}: SIGKILL pid {os.getpid()}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
