"""The dead-letter vocabulary, defined once: why a message was dead-lettered, and how its
record was resolved (``dead_letter.reason`` and ``dead_letter.resolution``; the CLI, the
API, the dashboard and the handler all take their values from here)."""

from __future__ import annotations

from enum import StrEnum


class DeadLetterReason(StrEnum):
    EXPIRED = "expired"  # its queue's TTL ran out (the worker did not take it in time)
    REJECTED = "rejected"  # not a Conveyor message, or not for that queue
    POISON = "poison"  # the handler kept failing on it
    MAX_REDELIVERIES = "max_redeliveries"  # consumers kept dying holding it


class Resolution(StrEnum):
    PENDING = "pending"  # recorded, not resolved (yet)
    RESCHEDULED = "rescheduled"  # its execution was handed back to be placed elsewhere
    FAILED = "failed"  # its execution failed (out of reschedules)
    STALE = "stale"  # the execution had moved on: nothing to do
    INVALID = "invalid"  # not a Conveyor message
    REPLAYED = "replayed"  # published again by an operator


REASONS: tuple[str, ...] = tuple(r.value for r in DeadLetterReason)
RESOLUTIONS: tuple[str, ...] = tuple(r.value for r in Resolution)
