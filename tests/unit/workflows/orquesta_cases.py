"""Definitions where Orquesta's semantics keep a workflow finite, with what Orquesta's own
conductor dispatches for them. The counts were produced by bench/orquesta_counts.py
(which drives orquesta.conducting.WorkflowConductor; the project's tests cannot import
orquesta) and are re-checked there: ``python bench/orquesta_counts.py --check`` in a venv
with orquesta installed. test_conductor_finite.py holds Conveyor's conductor to them.

The driver (both sides): in rounds, every child requested is started and then ended
(failed if its task is in ``fail``, else succeeded), then the next requests are read.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    definition: str
    fail: frozenset[str]
    per_task: dict[str, int]  # children Orquesta dispatches, by task (a retry is one more)
    status: str  # how Orquesta's workflow ends


CASES: dict[str, Case] = {
    # `do: retry` with no `when`: Orquesta's composer makes it retry {when: completed(), count: 3}.
    "retry_command_no_when": Case(
        """
version: 1.0
tasks:
  a:
    action: core.noop
    next:
      - do: retry
""",
        frozenset(),
        {"a": 4},
        "succeeded",
    ),
    # The same on a failing task: 4 attempts, then the failure is unhandled.
    "retry_command_no_when_failing": Case(
        """
version: 1.0
tasks:
  a:
    action: core.noop
    next:
      - do: retry
""",
        frozenset({"a"}),
        {"a": 4},
        "failed",
    ),
    # Its other transitions are followed once, after the last attempt.
    "retry_command_beside_a_transition": Case(
        """
version: 1.0
tasks:
  a:
    action: core.noop
    next:
      - do: retry
      - do: b
  b:
    action: core.noop
""",
        frozenset(),
        {"a": 4, "b": 1},
        "succeeded",
    ),
    # A cycle beside a fork: both branches of the fork come back to the cycle's head (no
    # join), which forks again while a counter allows. Arrivals at the head before it
    # started make one instance (Orquesta merges them into the staged task).
    "cycle_beside_a_fork": Case(
        """
version: 1.0
vars:
  - n: 0
tasks:
  init:
    action: core.noop
    next:
      - do: head
  head:
    action: core.noop
    next:
      - when: <% ctx(n) < 5 %>
        publish: n=<% ctx(n) + 1 %>
        do: [left, right]
  left:
    action: core.noop
    next:
      - do: head
  right:
    action: core.noop
    next:
      - do: head
""",
        frozenset(),
        {"head": 6, "init": 1, "left": 5, "right": 5},
        "succeeded",
    ),
    "cycle_beside_a_fork_of_three": Case(
        """
version: 1.0
vars:
  - n: 0
tasks:
  init:
    action: core.noop
    next:
      - do: head
  head:
    action: core.noop
    next:
      - when: <% ctx(n) < 5 %>
        publish: n=<% ctx(n) + 1 %>
        do: [x, y, z]
  x:
    action: core.noop
    next:
      - do: head
  y:
    action: core.noop
    next:
      - do: head
  z:
    action: core.noop
    next:
      - do: head
""",
        frozenset(),
        {"head": 6, "init": 1, "x": 5, "y": 5, "z": 5},
        "succeeded",
    ),
}
