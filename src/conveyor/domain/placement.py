"""Choosing a worker for each claimed execution. Pure: no I/O, unit-tested alone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


def free_capacity(capacity: int, prefetch: int, load: int) -> int:
    """A worker's room for more executions, the one computation of it: its slots and its
    prefetch, less its load (the executions on it: SQL ``worker_load()``, migration 0037).
    Negative when a worker's capacity or prefetch shrank below its load."""
    return capacity + prefetch - load


@dataclass(frozen=True, slots=True)
class Claim:
    id: int
    action_ref: str
    runner_type: str
    runtime: str
    age: float  # seconds since the execution was requested (database clock)
    avoid: frozenset[int] = frozenset()  # workers that did not pick it up in time before


@dataclass(slots=True)
class Candidate:
    id: int
    runtimes: Sequence[str]
    actions: Sequence[str]
    capacity: int  # slots: executions it runs at once
    load: int  # executions on it: scheduled (prefetched) or running
    accepting: bool = True  # False: alive but draining or cordoned
    # Executions it takes beyond its slots, waiting on it to start the moment a slot
    # frees (worker.prefetch): a slot then never waits for a scheduling round.
    prefetch: int = 0

    def can_run(self, claim: Claim) -> bool:
        # Python actions need the worker to have imported their code; subprocess
        # actions are data and run anywhere their runtime is offered.
        if claim.action_ref in self.actions:
            return True
        return claim.runner_type == "subprocess" and claim.runtime in self.runtimes

    @property
    def free(self) -> int:
        return free_capacity(self.capacity, self.prefetch, self.load)


@dataclass(slots=True)
class Placement:
    assigned: list[tuple[int, int]] = field(default_factory=list)  # (execution, worker)
    no_capacity: list[int] = field(default_factory=list)  # capable workers exist but are full
    no_worker: list[int] = field(default_factory=list)  # no live worker can run it at all


def place(claims: Sequence[Claim], workers: Sequence[Candidate]) -> Placement:
    """Assign claims in order, each to the least loaded capable worker with a free slot
    (load relative to capacity, then absolute load, then id for determinism), preferring
    workers that have not already let this execution time out unstarted. A worker that
    is alive but not accepting still counts as capable: the execution waits for it.
    Free means a free slot or room in the worker's prefetch; least loaded first, so an
    idle slot anywhere is filled before anyone's prefetch."""
    result = Placement()
    for claim in claims:
        capable = [w for w in workers if w.can_run(claim)]
        if not capable:
            result.no_worker.append(claim.id)
            continue
        open_ = [w for w in capable if w.accepting and w.free > 0]
        if not open_:
            result.no_capacity.append(claim.id)
            continue
        best = min(open_, key=lambda w: (w.id in claim.avoid, w.load / w.capacity, w.load, w.id))
        best.load += 1
        result.assigned.append((claim.id, best.id))
    return result
